"""Routes and semantics of the Responses API, with the SDK against the real stack."""

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import httpx
import nats
import openai
import orjson
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import KeyNotFoundError

from steno.schemas.bus import WorkerRegistration, token_partition_message, unpacked
from steno.schemas.events import AnnouncedEvents
from steno.schemas.ids import origin_of
from steno.services.common.bus import Names, model_token, worker_registry
from steno.services.common.followers import follow_key
from tests.conftest import SLOW_MODEL, stepping_together_in_one_partition
from tests.token_streams import create, neighbours, publish_interleaved, statuses, stream_of

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"


def sse_events(reply: httpx.Response, stop_after: int | None = None) -> list[dict]:
    events = []
    for line in reply.iter_lines():
        if line.startswith("data: "):
            events.append(orjson.loads(line[6:]))
            if stop_after is not None and len(events) >= stop_after:
                break
    return events


def test_background_stream_dropped_and_resumed_on_another_replica(stack, client):
    created = client.responses.create(model=SLOW_MODEL, input="resume me across replicas", background=True,
                                      stream=False)
    url = f"/responses/{created.id}"
    with httpx.stream("GET", stack.url_of(0) + url, params={"stream": "true"}, headers=stack.headers(),
                      timeout=30) as reply:
        first = sse_events(reply, stop_after=6)
    # The client drops here; generation goes on. It comes back to the other replica.
    cursor = first[-1]["sequence_number"]
    with httpx.stream("GET", stack.url_of(1) + url, params={"stream": "true", "starting_after": cursor},
                      headers=stack.headers(), timeout=60) as reply:
        rest = sse_events(reply)
    seqs = [e["sequence_number"] for e in first + rest]
    assert seqs == list(range(len(seqs)))
    assert rest[-1]["type"] == "response.completed"
    text = "".join(e["delta"] for e in first + rest if e["type"] == "response.output_text.delta")
    final = client.responses.retrieve(created.id)
    assert text == final.output_text and final.status == "completed"


async def test_a_stream_resumed_on_another_replica_is_announced_to_it_live(stack, settings):
    """The replica that follows a response made elsewhere registers itself, and the parser
    announces the response's commits on that replica's own subject (not only to the
    replica that made it); once its stream ends, the registration is gone."""
    names = Names.from_settings(settings)
    async with httpx.AsyncClient(headers=stack.headers(), timeout=60) as http:
        made_there = await http.post(stack.url_of(1) + "/responses", json={"model": MODEL, "input": "origin"})
        other_origin = origin_of(made_there.json()["id"])
        nc = await nats.connect(settings.nats_url)
        announced_there: list[int] = []
        response_id = ""

        async def on_announcement(msg) -> None:
            for committed in AnnouncedEvents.model_validate_json(msg.data).committed:
                if committed.response_id == response_id:
                    announced_there.extend(event.seq for event in committed.events)

        try:
            await nc.subscribe(names.events_subject(other_origin), cb=on_announcement)
            created = await http.post(stack.url_of(0) + "/responses", json={
                "model": SLOW_MODEL, "input": "follow me from the other replica", "background": True})
            response_id = created.json()["id"]
            assert origin_of(response_id) != other_origin
            seqs: list[int] = []
            async with http.stream("GET", stack.url_of(1) + f"/responses/{response_id}",
                                   params={"stream": "true"}) as reply:
                async for line in reply.aiter_lines():
                    if line.startswith("data: "):
                        seqs.append(orjson.loads(line[6:])["sequence_number"])
            await nc.flush()
            assert seqs == list(range(len(seqs)))
            # Most of the slow response was generated while the other replica followed it.
            assert len(announced_there) > len(seqs) // 2 and announced_there[-1] == seqs[-1]
            followers = await nc.jetstream().key_value(names.followers_bucket)
            key = follow_key(response_id, other_origin)
            deadline = time.monotonic() + 10
            while await followers_has(followers, key) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert not await followers_has(followers, key)
        finally:
            await nc.close()


async def followers_has(bucket, key: str) -> bool:
    try:
        await bucket.get(key)
    except KeyNotFoundError:
        return False
    return True


def test_last_event_id_header_resumes_too(stack, client):
    done = client.responses.create(model=MODEL, input="header cursor")
    with httpx.stream("GET", f"{stack.base_url}/responses/{done.id}", params={"stream": "true"},
                      headers={**stack.headers(), "Last-Event-ID": "3"}, timeout=30) as reply:
        events = sse_events(reply)
    assert events[0]["sequence_number"] == 4


def test_sdk_full_replay_of_a_finished_response(client):
    done = client.responses.create(model=MODEL, input="replay all")
    with client.responses.stream(response_id=done.id) as stream:
        events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == done.output_text


@pytest.mark.parametrize(("cursor", "status"), [("-2", 400), ("abc", 400), ("9999", 400), ("1.5", 400)])
def test_bad_cursors_are_clear_4xx(stack, client, cursor, status):
    done = client.responses.create(model=MODEL, input="cursor checks")
    reply = httpx.get(f"{stack.base_url}/responses/{done.id}", params={"stream": "true", "starting_after": cursor},
                      headers=stack.headers(), timeout=10)
    assert reply.status_code == status
    assert reply.json()["error"]["param"] == "starting_after"


def test_cursor_at_the_terminal_event_is_beyond_the_end(stack, client):
    done = client.responses.create(model=MODEL, input="the end")
    with client.responses.stream(response_id=done.id) as stream:
        last = list(stream)[-1].sequence_number
    reply = httpx.get(f"{stack.base_url}/responses/{done.id}", params={"stream": "true", "starting_after": last},
                      headers=stack.headers(), timeout=10)
    assert reply.status_code == 400


def test_a_cursor_past_the_current_end_of_a_running_response_waits_for_the_events(client):
    """The README's background example, as written: the stream is asked for right after
    the job is created, from a cursor its log has not reached yet."""
    job = client.responses.create(model=SLOW_MODEL, input="later " * 10, background=True)
    events = list(client.responses.retrieve(job.id, stream=True, starting_after=3))
    assert [e.sequence_number for e in events] == list(range(4, 4 + len(events)))
    assert events[-1].type == "response.completed"


def test_a_cursor_beyond_where_a_running_response_ends_ends_the_stream_when_it_does(stack, client):
    job = client.responses.create(model=SLOW_MODEL, input="short", background=True)
    started = time.monotonic()
    reply = httpx.get(f"{stack.base_url}/responses/{job.id}", params={"stream": "true", "starting_after": 5000},
                      headers=stack.headers(), timeout=60)
    assert reply.status_code == 200 and "data:" not in reply.text
    assert client.responses.retrieve(job.id).status == "completed"
    assert time.monotonic() - started < 50


def test_retrieve_while_in_progress_shows_partial_output(client):
    created = client.responses.create(model=SLOW_MODEL, input="partial snapshot please", background=True)
    assert created.status == "queued"
    deadline = time.monotonic() + 20
    while True:
        snapshot = client.responses.retrieve(created.id)
        if snapshot.status == "in_progress" and snapshot.output:
            break
        assert time.monotonic() < deadline, snapshot
        time.sleep(0.1)
    assert snapshot.output[0].status == "in_progress"
    client.responses.cancel(created.id)


def test_cancel_background_response(stack, client):
    created = client.responses.create(model=SLOW_MODEL, input="cancel me " * 20, background=True)
    with httpx.stream("GET", f"{stack.base_url}/responses/{created.id}", params={"stream": "true"},
                      headers=stack.headers(), timeout=30) as reply:
        sse_events(reply, stop_after=4)
    started = time.monotonic()
    cancelled = client.responses.cancel(created.id)
    took = time.monotonic() - started
    assert cancelled.status == "cancelled"
    assert took < 5, f"cancel took {took:.2f}s"
    assert client.responses.cancel(created.id).status == "cancelled"  # idempotent
    with client.responses.stream(response_id=created.id) as stream:
        events = list(stream)
    assert events[-1].type == "response.completed" and events[-1].response.status == "cancelled"
    assert all(item.status == "incomplete" for item in events[-1].response.output if item.status)


async def test_cancel_ends_a_response_no_worker_will_ever_take(stack, settings, client):
    """A model whose only worker is gone (its registration lingers a few seconds): the
    response stays queued, and a cancel still ends it."""
    model = "steno-orphaned"
    nc = await nats.connect(settings.nats_url)
    try:
        registry = await worker_registry(nc.jetstream(), Names.from_settings(settings))
        registration = WorkerRegistration(model=model, engine="simulator", dialect="harmony", context_tokens=1000)
        await registry.put(model_token(model), registration.model_dump_json().encode())
    finally:
        await nc.close()
    created = await asyncio.to_thread(client.responses.create, model=model, input="nobody takes me", background=True)
    await asyncio.sleep(0.5)
    assert (await asyncio.to_thread(client.responses.retrieve, created.id)).status == "queued"
    started = time.monotonic()
    cancelled = await asyncio.to_thread(client.responses.cancel, created.id)
    assert cancelled.status == "cancelled"
    assert time.monotonic() - started < 9
    stored = await asyncio.to_thread(client.responses.retrieve, created.id)
    assert stored.status == "cancelled"


async def test_a_store_false_response_leaves_no_tokens_on_the_bus(settings, client):
    with client.responses.stream(model=MODEL, input="leave no trace", store=False) as stream:
        final = stream.get_final_response()
    names = Names.from_settings(settings)
    nc = await nats.connect(settings.nats_url)
    try:
        for _ in range(50):
            info = await nc.jetstream().stream_info(names.tokens_stream, subjects_filter=names.tokens_subject(final.id))
            if not (info.state.subjects or {}).get(names.tokens_subject(final.id)):
                break
            await asyncio.sleep(0.1)
        assert not (info.state.subjects or {}).get(names.tokens_subject(final.id))
        stored = await asyncio.to_thread(client.responses.create, model=MODEL, input="keep my tokens")
        info = await nc.jetstream().stream_info(names.tokens_stream, subjects_filter=names.tokens_subject(stored.id))
        assert (info.state.subjects or {}).get(names.tokens_subject(stored.id))  # a stored one keeps them
    finally:
        await nc.close()


async def test_only_stored_responses_share_token_messages(stack, settings):
    """Streams stepping together have their batches grouped per partition, but never
    those of a response that is not stored: its tokens go where its end purges them."""
    names = Names.from_settings(settings)
    long_input = " ".join(["steady"] * 60)  # echoed back: each response streams for seconds
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0, timeout=60)
    nc = await nats.connect(settings.nats_url)
    try:
        js = nc.jetstream()
        before = (await js.stream_info(names.tokens_stream)).state.last_seq
        not_stored = asyncio.gather(*(client.responses.create(model=SLOW_MODEL, input=f"unstored {n} {long_input}",
                                                              store=False) for n in range(8)))
        stored, sharing = await stepping_together_in_one_partition(client, SLOW_MODEL, names.token_partitions,
                                                                   long_input)
        assert {response.status for response in await not_stored} == {"completed"}
        grouped: set[str] = set()
        subscription = await js.subscribe(f"{names.namespace}.tokens.*.grouped", stream=names.tokens_stream,
                                          ordered_consumer=True, config=ConsumerConfig(
                                              deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                              opt_start_seq=before + 1))
        try:
            while True:
                try:
                    msg = await subscription.next_msg(timeout=1)
                except nats.errors.TimeoutError:
                    break
                grouped |= {message.response_id
                            for message, _ in unpacked(token_partition_message.validate_json(msg.data), None)}
        finally:
            await subscription.unsubscribe()
    finally:
        await nc.close()
        await client.close()
    assert set(sharing) <= grouped, "two stored responses stepping together in one partition were not grouped"
    assert grouped <= stored


async def test_line_separators_in_text_go_escaped_in_sse_data(stack, settings, db):
    text = "one\u2028two\u2029three\x85four"
    (rid,) = neighbours(settings, 1)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=1)
    try:
        await create(pool, rid, "separators")
    finally:
        await pool.close()
    await publish_interleaved(settings, [stream_of(rid, text)])
    assert await statuses(db, [rid], 1) == {rid: "completed"}
    reply = await asyncio.to_thread(httpx.get, f"{stack.base_url}/responses/{rid}", params={"stream": "true"},
                                    headers=stack.headers(), timeout=30)
    raw = reply.text
    assert "\u2028" not in raw and "\u2029" not in raw and "\x85" not in raw
    lines = raw.splitlines()  # what breaks on a raw U+2028 keeps every frame whole now
    data = [orjson.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert data[-1]["response"]["output"][-1]["content"][0]["text"] == text


def test_cancel_of_finished_or_foreground_responses_is_a_400(client):
    finished = client.responses.create(model=MODEL, input="done already", background=True)
    with client.responses.stream(response_id=finished.id) as stream:
        list(stream)
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(finished.id)
    foreground = client.responses.create(model=MODEL, input="not background")
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(foreground.id)


async def test_delete_removes_everything(client, db):
    done = client.responses.create(model=MODEL, input="forget me")
    deleted = client.responses.delete(done.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(done.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(done.id)
    for table in ("response_events", "response_tokens", "response_input_items"):
        assert await db.fetchval(f"SELECT count(*) FROM {table} WHERE response_id = $1", done.id) == 0
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(done.id)


def test_delete_returns_openai_shape(stack, client):
    done = client.responses.create(model=MODEL, input="delete shape")
    reply = httpx.delete(f"{stack.base_url}/responses/{done.id}", headers=stack.headers(), timeout=10)
    assert reply.json() == {"id": done.id, "object": "response.deleted", "deleted": True}


def test_input_items_paging(client):
    items = [{"role": "user", "content": f"message {i}"} for i in range(5)]
    done = client.responses.create(model=MODEL, input=items)
    page = client.responses.input_items.list(done.id, limit=2)
    assert [i.content[0].text for i in page.data] == ["message 4", "message 3"]
    assert page.has_more and page.first_id == page.data[0].id and page.last_id == page.data[-1].id
    rest = client.responses.input_items.list(done.id, limit=10, after=page.last_id)
    assert [i.content[0].text for i in rest.data] == ["message 2", "message 1", "message 0"]
    assert not rest.has_more
    ascending = client.responses.input_items.list(done.id, order="asc")
    assert [i.content[0].text for i in ascending.data] == [f"message {i}" for i in range(5)]
    every = [i.content[0].text for i in client.responses.input_items.list(done.id, limit=1, order="asc")]
    assert every == [f"message {i}" for i in range(5)]  # the SDK's auto-pagination


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 101}, {"order": "sideways"}, {"after": "nope"},
                                    {"include[]": "bogus"}])
def test_input_items_bad_parameters(stack, client, params):
    done = client.responses.create(model=MODEL, input="params")
    reply = httpx.get(f"{stack.base_url}/responses/{done.id}/input_items", params=params, headers=stack.headers(),
                      timeout=10)
    assert reply.status_code == 400 and reply.json()["error"]["message"]


def test_previous_response_id_carries_the_conversation(client):
    first = client.responses.create(model=MODEL, input="first turn", instructions="Be brief.")
    second = client.responses.create(model=MODEL, input="second turn", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert second.instructions is None  # not inherited
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.output_text == "Steno simulator reply: second turn"


def test_unknown_previous_response_is_a_400(stack):
    reply = httpx.post(f"{stack.base_url}/responses", headers=stack.headers(),
                       json={"model": MODEL, "input": "x", "previous_response_id": "resp_nope"}, timeout=10)
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "previous_response_not_found"
    assert reply.json()["error"]["param"] == "previous_response_id"


def test_store_false_is_not_retrievable_nor_chainable(client):
    unstored = client.responses.create(model=MODEL, input="ephemeral", store=False)
    assert unstored.status == "completed" and unstored.output_text
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="next", previous_response_id=unstored.id)
    assert info.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="x", store=False, background=True)


def test_store_false_stream_still_streams(client):
    with client.responses.stream(model=MODEL, input="ephemeral stream", store=False) as stream:
        events = list(stream)
    assert events[-1].type == "response.completed"


@pytest.mark.parametrize(
    ("metadata", "ok"),
    [({f"k{i}": "v" for i in range(16)}, True), ({f"k{i}": "v" for i in range(17)}, False),
     ({"k" * 65: "v"}, False), ({"k": "v" * 513}, False)],
)
def test_metadata_limits(client, metadata, ok):
    if ok:
        assert client.responses.create(model=MODEL, input="m", metadata=metadata).metadata == metadata
    else:
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model=MODEL, input="m", metadata=metadata)
        assert info.value.body["param"] == "metadata"


def test_unknown_model_is_a_404_soon(client):
    started = time.monotonic()
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="no-such-model", input="x")
    assert info.value.code == "model_not_found"
    assert time.monotonic() - started < 5


def test_oversized_body_is_a_413(stack):
    reply = httpx.post(f"{stack.base_url}/responses", headers=stack.headers(), timeout=30,
                       json={"model": MODEL, "input": "x" * (33 * 1024 * 1024)})
    assert reply.status_code == 413
    assert reply.json()["error"]["message"]


def test_client_hang_up_does_not_stop_background_generation(stack, client):
    created = client.responses.create(model=SLOW_MODEL, input="keep going", background=True)
    with httpx.stream("GET", f"{stack.base_url}/responses/{created.id}", params={"stream": "true"},
                      headers=stack.headers(), timeout=30) as reply:
        sse_events(reply, stop_after=3)
    deadline = time.monotonic() + 30
    while client.responses.retrieve(created.id).status != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_include_logprobs_is_accepted_and_unknown_include_rejected(client):
    done = client.responses.create(model=MODEL, input="x", include=["message.output_text.logprobs"])
    assert done.status == "completed"
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="x", include=["everything"])


def test_concurrent_streams_are_each_gapless(stack):
    async def one(i: int):
        body = {"model": MODEL, "input": f"stream {i}", "stream": True}
        async with httpx.AsyncClient(timeout=30) as http, \
                http.stream("POST", f"{stack.base_url}/responses", headers=stack.headers(), json=body) as reply:
            events = [orjson.loads(line[6:]) async for line in reply.aiter_lines() if line.startswith("data: ")]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        return events[-1]["response"]["output"][-1]["content"][0]["text"]

    async def many():
        return await asyncio.gather(*(one(i) for i in range(20)))

    texts = asyncio.run(many())
    assert texts == [f"Steno simulator reply: stream {i}" for i in range(20)]


def readme_python_examples() -> list[str]:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    return [block.split("```", 1)[0] for block in readme.split("```python\n")[1:]]


def test_the_readmes_client_library_examples_run_as_written(stack, tmp_path):
    """Every Python example after the first (the agent clients), each in a process of its
    own as a user would run it, against this stack."""
    examples = readme_python_examples()[1:]
    assert examples
    for number, example in enumerate(examples):
        assert '"http://127.0.0.1:8080/v1"' in example and 'api_key="unused"' in example
        script = tmp_path / f"example_{number}.py"
        script.write_text(example.replace('"http://127.0.0.1:8080/v1"', f'"{stack.base_url}"')
                          .replace('api_key="unused"', f'api_key="{stack.keys["a"]}"'))
        ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert "Steno simulator reply" in ran.stdout, ran.stdout


def test_the_readmes_sdk_example_runs_as_written(stack, capsys):
    """README's "Using it" example, against this stack (its URL and key swapped in)."""
    example = readme_python_examples()[0]
    assert 'base_url="http://127.0.0.1:8080/v1", api_key="unused"' in example
    example = example.replace('base_url="http://127.0.0.1:8080/v1", api_key="unused"',
                              f'base_url="{stack.base_url}", api_key="{stack.keys["a"]}"')
    exec(compile(example, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "completed Steno simulator reply: hi" in printed
    assert "response.completed" in printed
