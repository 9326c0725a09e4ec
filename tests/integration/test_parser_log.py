"""The parser's log on real Postgres: deterministic, exactly-once, auditable."""

import asyncio
import subprocess
import sys
import time

import httpx
import orjson
import pytest

from steno.infra.processes import service_env
from tests.events_oracle import validate_response

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def stream_frames(stack, body):
    with httpx.stream("POST", stack.base_url + "/responses", json={**body, "stream": True}, headers=stack.headers(),
                      timeout=30) as reply:
        text = reply.read().decode()
    frames = []
    for block in filter(str.strip, text.split("\n\n")):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        frames.append((int(fields["id"]), fields["event"], fields["data"]))
    return frames


def plain(item) -> dict:
    """An output item without the fields the SDK's stream helper adds (``parsed*``)."""
    def without_parsed(value):
        if isinstance(value, dict):
            return {k: without_parsed(v) for k, v in value.items() if not k.startswith("parsed")}
        if isinstance(value, list):
            return [without_parsed(v) for v in value]
        return value

    return without_parsed(item.model_dump())


def steno(stack, *args):
    return subprocess.run([sys.executable, "-m", "steno.services.cli", *args], env=service_env(stack.settings),
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("wiped", ["seq >= 1", "seq BETWEEN 3 AND 6"], ids=["every-parser-event", "a-gap"])
async def test_parse_wipe_reparse_gives_byte_identical_events(stack, db, wiped):
    """A gap amid stored events makes the restore's commit meet their keys: it skips them
    and writes the rest, the path a commit overlapping another writer's takes too."""
    seen = stream_frames(stack, {"model": MODEL, "input": "audit me, déjà vu 日本", "tools": [WEATHER]})
    response_id = orjson.loads(seen[0][2])["response"]["id"]

    audit = steno(stack, "audit", "verify", response_id)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "byte-identical" in audit.stdout

    await db.execute(f"DELETE FROM response_events WHERE response_id = $1 AND {wiped}", response_id)
    assert steno(stack, "audit", "verify", response_id).returncode == 1
    restored = steno(stack, "audit", "verify", response_id, "--restore")
    assert restored.returncode == 0, restored.stdout + restored.stderr
    rows = await db.fetch("SELECT seq, type, payload FROM response_events WHERE response_id = $1 ORDER BY seq",
                          response_id)
    assert [tuple(r) for r in rows] == seen


async def publish_stored_batches_again(db, settings, response_id: str) -> None:
    """Publishes a response's stored batches again, as a redelivery would (the first one
    carrying the parser seed as the worker sends it), and waits until the parser has
    taken them all."""
    import nats

    from steno.services.common.bus import Names

    batches = await db.fetch(
        "SELECT attempt, batch_no, token_ids, ended::text AS ended FROM response_tokens WHERE response_id = $1"
        " ORDER BY attempt, batch_no", response_id)
    context = await db.fetchrow("SELECT base_snapshot::text, parse_context::text FROM responses WHERE id = $1",
                                response_id)
    chain_head = await db.fetchval("SELECT hash FROM response_log WHERE response_id = $1 AND seq = 0", response_id)
    seed = {"base_snapshot": orjson.loads(context[0]), "parse_context": orjson.loads(context[1]),
            "chain_head": chain_head.hex()}
    names = Names(settings.namespace, settings.token_partitions)
    nc = await nats.connect(settings.nats_url)
    try:
        js = nc.jetstream()
        for row in batches:
            ended = orjson.loads(row["ended"]) if row["ended"] else None
            if ended is not None and ended["batch_count"] == row["batch_no"]:
                body = row["ended"].encode()  # an end recorded on its own
            else:
                body = orjson.dumps({"kind": "tokens", "response_id": response_id, "attempt": row["attempt"],
                                     "batch_no": row["batch_no"], "token_ids": list(row["token_ids"]),
                                     "parser_seed": seed if row["batch_no"] == 0 else None, "ended": ended})
            # No Nats-Msg-Id: JetStream stores it again, the parser sees it twice.
            await js.publish(names.tokens_subject(response_id), body)
        partition = int(names.tokens_subject(response_id).split(".")[2])
        for _ in range(100):
            info = await js.consumer_info(names.tokens_stream, names.parser_consumer(partition))
            if info.num_pending == 0 and info.num_ack_pending == 0:
                break
            await asyncio.sleep(0.1)
        assert info.num_pending == 0 and info.num_ack_pending == 0
    finally:
        await nc.close()


async def test_redelivered_and_duplicated_batches_leave_the_log_exactly_once(stack, db, settings):
    """A response's batches delivered again after it has finished."""
    seen = stream_frames(stack, {"model": MODEL, "input": "once only"})
    response_id = orjson.loads(seen[0][2])["response"]["id"]
    await publish_stored_batches_again(db, settings, response_id)
    rows = await db.fetch("SELECT seq, type, payload FROM response_events WHERE response_id = $1 ORDER BY seq",
                          response_id)
    assert [tuple(r) for r in rows] == seen


async def test_the_first_batch_carries_the_seed_the_api_recorded(stack, client, db, settings):
    """The worker passes the API's parser seed on to the response's first batch as it
    came: what Postgres holds for the response, chained to its stored event's hash (a
    seed lost on the way would go unseen, the parser reading it back from Postgres)."""
    import nats

    from steno.schemas.bus import ParserSeed, TokenBatch, token_partition_message, unpacked
    from steno.services.common.bus import Names

    response = client.responses.create(model=MODEL, input="seeded from the request", instructions="Be brief.")
    names = Names(settings.namespace, settings.token_partitions)
    partition = names.tokens_subject(response.id).split(".")[2]
    nc = await nats.connect(settings.nats_url)
    try:
        js = nc.jetstream()
        subscription = await js.subscribe(f"{settings.namespace}.tokens.{partition}.>", stream=names.tokens_stream,
                                          ordered_consumer=True)
        first = None
        while first is None:
            msg = await subscription.next_msg(timeout=5)
            for message, _ in unpacked(token_partition_message.validate_json(msg.data), None):
                if isinstance(message, TokenBatch) and message.response_id == response.id and message.batch_no == 0:
                    first = message
        await subscription.unsubscribe()
    finally:
        await nc.close()
    recorded = await db.fetchrow("SELECT base_snapshot::text, parse_context::text FROM responses WHERE id = $1",
                                 response.id)
    chain_head = await db.fetchval("SELECT hash FROM response_log WHERE response_id = $1 AND seq = 0", response.id)
    assert first.parser_seed == ParserSeed(base_snapshot=orjson.loads(recorded[0]),
                                           parse_context=orjson.loads(recorded[1]), chain_head=chain_head.hex())
    assert first.parser_seed.base_snapshot["instructions"] == "Be brief."


def test_tool_round_trip_through_the_sdk_stream_helper(client):
    with client.responses.stream(model=MODEL, input="Paris", tools=[WEATHER]) as stream:
        events = list(stream)
        first = stream.get_final_response()
    call = first.output[-1]
    assert call.type == "function_call" and call.name == "get_weather"
    assert orjson.loads(call.arguments) == {"city": "Paris"}
    assert "response.function_call_arguments.delta" in [e.type for e in events]
    retrieved = client.responses.retrieve(first.id)
    assert plain(retrieved.output[-1]) == plain(call)

    second = client.responses.create(
        model=MODEL, tools=[WEATHER],
        input=[{"role": "user", "content": "Paris"}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C"}],
    )
    assert second.output_text == "Steno simulator reply: the tool returned sunny, 21C"


@pytest.mark.parametrize(
    ("tools", "item_type"),
    [
        # Built-in tools this server does not run are not offered: the model answers.
        ([{"type": "web_search"}], "message"),
        ([{"type": "code_interpreter", "container": {"type": "auto"}}], "message"),
        ([{"type": "tool_search", "execution": "client", "description": "Find tools."}], "tool_search_call"),
        ([{"type": "namespace", "name": "crm", "description": "CRM",
           "tools": [{"type": "function", "name": "find_user", "parameters": {
               "type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]}}]}],
         "function_call"),
        ([{"type": "custom", "name": "apply_patch", "description": "Apply a patch"}], "custom_tool_call"),
    ],
)
def test_tool_kinds_end_to_end(client, tools, item_type):
    with client.responses.stream(model=MODEL, input="a@b.c", tools=tools) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    item = final.output[-1]
    assert item.type == item_type
    if tools[0]["type"] == "namespace":
        assert (item.namespace, item.name) == ("crm", "find_user")
    if item_type == "custom_tool_call":
        assert item.input == "a@b.c"
    if item_type == "tool_search_call":
        assert item.arguments == {"query": "a@b.c"} and item.execution == "client"
    retrieved = validate_response(client.responses.retrieve(final.id).model_dump())
    assert plain(retrieved.output[-1]) == plain(item)


async def test_a_backlog_without_seeds_is_rebuilt_from_postgres(stack, db, settings):
    """Token batches with no parser seed, as a parser finds them after a restart or a
    takeover: every response's state is rebuilt from Postgres (several in one fetch), its
    events are those the pure parser makes of the same batches, and batches of a response
    Postgres does not have are dropped without holding up the others."""
    import asyncpg
    import nats

    from steno.schemas.api import CreateResponseRequest
    from steno.schemas.bus import GenerationEnded, TokenBatch
    from steno.schemas.responses import ParseContext
    from steno.services.api.response_plan import plan_response
    from steno.services.api.store import ResponseStore
    from steno.services.common.bus import Names
    from steno.services.dialects import dialect_named
    from steno.services.parser.response_state import ResponseState
    from steno.services.worker.simulator import completion_tokens

    harmony = dialect_named("harmony")
    names = Names(settings.namespace, settings.token_partitions)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    nc = await nats.connect(settings.nats_url)
    expected: dict[str, list[tuple]] = {}
    try:
        js = nc.jetstream()
        messages = []
        for i in range(12):
            request = CreateResponseRequest(model=MODEL, input=f"backlog {i}", background=True)
            plan = plan_response(request, f"resp_backlog{i:02d}{settings.namespace}", "default", 1_700_000_000,
                                 harmony.render(request, 1_700_000_000))
            await ResponseStore(pool).create(plan.record, plan.first_events)
            rid = plan.record.response_id
            tokens = completion_tokens(harmony, plan.generation.prompt_token_ids)
            batches = [TokenBatch(response_id=rid, attempt=0, batch_no=n, token_ids=tokens[start:start + 8])
                       for n, start in enumerate(range(0, len(tokens), 8))]
            batches[-1].ended = GenerationEnded(response_id=rid, attempt=0, batch_count=len(batches),
                                                finish_reason="stop", prompt_tokens=10, output_tokens=len(tokens))
            context = ParseContext.model_validate(plan.record.parse_context)
            oracle = ResponseState(rid, plan.record.base_snapshot, context)
            expected[rid] = [(e.seq, e.type, e.payload) for e in plan.first_events]
            for batch in batches:
                expected[rid] += [(e.seq, e.type, e.payload) for e in oracle.apply(batch).events]
            messages += [(rid, batch) for batch in batches]
        unknown = "resp_backlogunknown" + settings.namespace
        messages.append((unknown, TokenBatch(response_id=unknown, attempt=0, batch_no=0, token_ids=[1, 2])))
        # Interleaved, as batches of concurrent responses reach a partition.
        messages.sort(key=lambda item: item[1].batch_no)
        for rid, batch in messages:
            await js.publish(names.tokens_subject(rid), batch.model_dump_json().encode())
        for _ in range(150):
            done = await db.fetchval("SELECT count(*) FROM responses WHERE id = ANY($1) AND status = 'completed'",
                                     list(expected))
            if done == len(expected):
                break
            await asyncio.sleep(0.1)
        assert done == len(expected)
    finally:
        await nc.close()
        await pool.close()
    for rid, events in expected.items():
        rows = await db.fetch("SELECT seq, type, payload FROM response_events WHERE response_id = $1 ORDER BY seq",
                              rid)
        assert [tuple(r) for r in rows] == events
    assert await db.fetchval("SELECT count(*) FROM response_events WHERE response_id = $1", unknown) == 0


def batches_as_a_worker_sends(response_id: str, parts: list[list[int]], base_snapshot: dict, parse_context: dict,
                              chain_head: bytes) -> list:
    """One attempt's batches of ``parts``: the first carrying the parser seed, the last the end."""
    from steno.schemas.bus import GenerationEnded, ParserSeed, TokenBatch

    batches = [TokenBatch(response_id=response_id, attempt=0, batch_no=i, token_ids=part)
               for i, part in enumerate(parts)]
    batches[0].parser_seed = ParserSeed(base_snapshot=base_snapshot, parse_context=parse_context,
                                        chain_head=chain_head.hex())
    batches[-1].ended = GenerationEnded(response_id=response_id, attempt=0, batch_count=len(parts),
                                        finish_reason="stop", prompt_tokens=10,
                                        output_tokens=sum(len(part) for part in parts))
    return batches


HELD_MODEL = "steno-held"


async def test_a_state_left_behind_by_another_writer_is_rebuilt(stack, client, db, settings):
    """Two parsers may write one response for a moment (one holds its partition until it
    notices it has lost it). Here the test is the worker, publishing the batches, and
    the other parser, committing one batch behind the parser's back: the parser's state
    then waits for a batch that never comes back to it, and must be rebuilt from
    Postgres for the response to end."""
    import nats

    from steno.schemas.responses import ParseContext
    from steno.services.common.bus import Names
    from steno.services.common.db import create_pool
    from steno.services.dialects import DEFAULT_DIALECT, CompletionMessage, dialect_named
    from steno.services.parser.event_log import EventLog, ResponseWrite
    from steno.services.parser.response_state import ResponseState
    from tests.conftest import reparses_identically

    # A worker that takes the request and never answers: the test answers instead.
    worker = stack.add("worker-held", "worker", "--model", HELD_MODEL, "--sim-first-token-delay-ms", "3600000")
    try:
        for _ in range(150):
            if HELD_MODEL in {model.id for model in client.models.list()}:
                break
            assert worker.exited() is None, worker.log_text()
            await asyncio.sleep(0.2)
        response_id = client.responses.create(model=HELD_MODEL, input="answered by hand", background=True).id
        row = await db.fetchrow("SELECT base_snapshot::text, parse_context::text FROM responses WHERE id = $1",
                                response_id)
        base_snapshot, parse_context = orjson.loads(row[0]), orjson.loads(row[1])
        chain_head = await db.fetchval("SELECT hash FROM response_log WHERE response_id = $1 AND seq = 0",
                                       response_id)
        tokens = dialect_named(DEFAULT_DIALECT).write_completion(
            [CompletionMessage("final", "one two three four five six seven eight")])
        quarter = len(tokens) // 4
        parts = [tokens[:quarter], tokens[quarter:2 * quarter], tokens[2 * quarter:3 * quarter],
                 tokens[3 * quarter:]]
        batches = batches_as_a_worker_sends(response_id, parts, base_snapshot, parse_context, chain_head)
        names = Names(settings.namespace, settings.token_partitions)
        nc = await nats.connect(settings.nats_url)
        try:
            js = nc.jetstream()
            for batch in batches[:2]:
                await js.publish(names.tokens_subject(response_id), batch.model_dump_json().encode())
            for _ in range(100):
                if await db.fetchval("SELECT count(*) FROM response_tokens WHERE response_id = $1", response_id) == 2:
                    break
                await asyncio.sleep(0.1)
            # The other writer: the same state from Postgres, one batch further, committed.
            other = ResponseState(response_id, base_snapshot, ParseContext.model_validate(parse_context),
                                  chain_head=chain_head)
            for batch in batches[:3]:
                applied = other.apply(batch)
                assert applied is not None
                write = ResponseWrite(response_id, events=applied.events, consumed=applied.recorded)
            pool = await create_pool(settings.database_url, max_size=1)
            try:
                await EventLog(pool).commit([write])
            finally:
                await pool.close()
            await js.publish(names.tokens_subject(response_id), batches[3].model_dump_json().encode())
        finally:
            await nc.close()

        for _ in range(150):
            if client.responses.retrieve(response_id).status != "in_progress":
                break
            await asyncio.sleep(0.1)
        assert client.responses.retrieve(response_id).status == "completed"
        assert client.responses.retrieve(response_id).output_text == "one two three four five six seven eight"
        seqs = [r[0] for r in await db.fetch("SELECT seq FROM response_log WHERE response_id = $1 ORDER BY seq",
                                             response_id)]
        assert seqs == list(range(len(seqs)))
        assert await asyncio.to_thread(reparses_identically, stack.settings, response_id)
    finally:
        worker.stop()


async def stored_in_three_batches(settings, response_id: str, text: str) -> list:
    """A response stored as the API stores it, and its answer ``text`` as one attempt's
    three batches, the first with the parser's seed and the last with the end, unsent."""
    from steno.schemas.api import CreateResponseRequest
    from steno.services.api.response_plan import plan_response
    from steno.services.api.store import ResponseStore
    from steno.services.common.db import create_pool
    from steno.services.dialects import DEFAULT_DIALECT, CompletionMessage, dialect_named

    harmony = dialect_named(DEFAULT_DIALECT)
    request = CreateResponseRequest(model=MODEL, input="a gap in the middle", background=True)
    plan = plan_response(request, response_id, "a", 1_700_000_000, harmony.render(request, 1_700_000_000))
    pool = await create_pool(settings.database_url, max_size=1)
    try:
        chain_head = await ResponseStore(pool).create(plan.record, plan.first_events)
    finally:
        await pool.close()
    tokens = harmony.write_completion([CompletionMessage("final", text)])
    third = len(tokens) // 3
    return batches_as_a_worker_sends(response_id, [tokens[:third], tokens[third:2 * third], tokens[2 * third:]],
                                     plan.record.base_snapshot, plan.record.parse_context, chain_head)


async def test_a_batch_whose_predecessor_never_comes_fails_its_response(stack, client, db, settings):
    """A batch that stays ahead of everything stored for its response, delivery after
    delivery, follows one that is not coming (lost by the bus, say): the response fails
    visibly, with that end recorded, instead of waiting in_progress for good. No worker
    takes part: the test stores the response and publishes its batches, but one."""
    import nats

    from steno.services.common.bus import Names
    from steno.services.parser.service import MAX_RETRY_DELAY_S, PARKED_S, STRANDED_DELIVERIES
    from tests.conftest import reparses_identically

    response_id = f"resp_stranded{settings.namespace}"
    batches = await stored_in_three_batches(settings, response_id, "never quite whole")
    names = Names(settings.namespace, settings.token_partitions)
    nc = await nats.connect(settings.nats_url)
    try:
        js = nc.jetstream()
        for batch in (batches[0], batches[2]):  # the middle one is lost
            await js.publish(names.tokens_subject(response_id), batch.model_dump_json().encode())
    finally:
        await nc.close()
    deadline = time.monotonic() + PARKED_S + STRANDED_DELIVERIES * MAX_RETRY_DELAY_S + 30
    while (status := await db.fetchval("SELECT status FROM responses WHERE id = $1", response_id)) in (
            "queued", "in_progress"):
        assert time.monotonic() < deadline, "the response still waits for the lost batch"
        await asyncio.sleep(0.5)
    assert status == "failed"
    failed = client.responses.retrieve(response_id)
    assert failed.status == "failed"
    assert "never reached the parser" in failed.error.message
    seqs = [r[0] for r in await db.fetch("SELECT seq FROM response_log WHERE response_id = $1 ORDER BY seq",
                                         response_id)]
    assert seqs == list(range(len(seqs)))
    assert await asyncio.to_thread(reparses_identically, stack.settings, response_id)


async def test_a_batch_ahead_of_the_one_it_follows_waits_for_it_in_the_parser(stack, client, db, settings):
    """A batch that arrives before the one it follows (that one in a dead parser's hands
    until the ack wait, say) is kept in the parser, held, and applied as soon as the
    one it follows arrives, instead of going back to the stream to wait out a retry
    delay of its own, one that doubles with each delivery."""
    import nats

    from steno.services.common.bus import Names, partition_of
    from steno.services.parser.service import RETRY_DELAY_S
    from tests.conftest import reparses_identically

    response_id = f"resp_latebatch{settings.namespace}"
    batches = await stored_in_three_batches(settings, response_id, "whole after a wait")
    names = Names(settings.namespace, settings.token_partitions)
    consumer = names.parser_consumer(partition_of(response_id, names.token_partitions))
    nc = await nats.connect(settings.nats_url)
    try:
        js = nc.jetstream()
        for batch in (batches[0], batches[2]):
            await js.publish(names.tokens_subject(response_id), batch.model_dump_json().encode())
        await asyncio.sleep(4 * RETRY_DELAY_S)  # a batch handed back would have come again by now
        waiting = await js.consumer_info(names.tokens_stream, consumer)
        assert waiting.num_redelivered == 0
        assert waiting.num_ack_pending == 1  # the third batch, held by the parser
        await js.publish(names.tokens_subject(response_id), batches[1].model_dump_json().encode())
        deadline = time.monotonic() + 30
        while (status := await db.fetchval("SELECT status FROM responses WHERE id = $1", response_id)) in (
                "queued", "in_progress"):
            assert time.monotonic() < deadline, "the response still waits"
            await asyncio.sleep(0.1)
        # The parser acks a batch after its events are committed, so the acks may
        # reach the stream a moment after the status does.
        while (settled := await js.consumer_info(names.tokens_stream, consumer)).num_ack_pending:
            assert time.monotonic() < deadline, "the parser still holds batches of a finished response"
            await asyncio.sleep(0.1)
    finally:
        await nc.close()
    assert status == "completed"
    assert client.responses.retrieve(response_id).output_text == "whole after a wait"
    assert settled.num_redelivered == 0
    seqs = [r[0] for r in await db.fetch("SELECT seq FROM response_log WHERE response_id = $1 ORDER BY seq",
                                         response_id)]
    assert seqs == list(range(len(seqs)))
    assert await asyncio.to_thread(reparses_identically, stack.settings, response_id)


def test_a_token_message_on_its_last_delivery_fails_its_response_unparsed(settings, tmp_path):
    """A message that kills each parser it reaches (its process, not a Python error the
    parser could catch) is delivered as often as the consumer allows, then no more: were
    it its response's last, nothing would end that response. On its last delivery the
    parser does not parse it: the response fails visibly, where its stream stood, and
    the message is acked. The parsers before are played by the test, which takes the
    message and hands it back; what the parser goes by is the delivery count."""
    import openai
    from nats.aio.client import Client

    from steno.infra.embedded import free_port
    from steno.services.common.bus import Names, partition_of
    from steno.services.parser.service import GIVEN_UP_MESSAGE, MAX_DELIVER
    from tests.conftest import reparses_identically, separate_stack
    from tests.scraped_metrics import scrape, value

    with separate_stack(settings, "givenup", tmp_path) as stack:
        names = Names(stack.settings.namespace, stack.settings.token_partitions)
        response_id = f"resp_givenup{stack.settings.namespace}"
        consumer = names.parser_consumer(partition_of(response_id, names.token_partitions))
        batches = asyncio.run(stored_in_three_batches(stack.settings, response_id, "never told to the end"))

        async def publish(batch) -> None:
            nc = Client()
            await nc.connect(stack.settings.nats_url)
            try:
                await nc.jetstream().publish(names.tokens_subject(response_id), batch.model_dump_json().encode())
            finally:
                await nc.close()

        async def taken_and_handed_back(deliveries: int) -> None:
            nc = Client()
            await nc.connect(stack.settings.nats_url)
            try:
                feed = await nc.jetstream().pull_subscribe_bind(consumer, names.tokens_stream)
                for delivery in range(1, deliveries + 1):
                    [msg] = await feed.fetch(1, timeout=15)
                    assert msg.metadata.num_delivered == delivery
                    await msg.nak()
                await feed.unsubscribe()
            finally:
                await nc.close()

        async def consumer_settled() -> bool:
            nc = Client()
            await nc.connect(stack.settings.nats_url)
            try:
                info = await nc.jetstream().consumer_info(names.tokens_stream, consumer)
                return info.num_ack_pending == 0 and info.num_pending == 0
            finally:
                await nc.close()

        stack.add_api()
        client = openai.OpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0)
        first = stack.add("parser-1", "parser")
        for batch in batches[:2]:
            asyncio.run(publish(batch))
        deadline = time.monotonic() + 30
        while client.responses.retrieve(response_id).status != "in_progress" or not asyncio.run(consumer_settled()):
            assert time.monotonic() < deadline, "the first two batches were never parsed"
            time.sleep(0.1)
        first.stop()

        asyncio.run(publish(batches[2]))
        asyncio.run(taken_and_handed_back(MAX_DELIVER - 1))
        metrics_port = free_port()
        stack.add("parser-2", "parser", "--metrics-port", str(metrics_port))
        deadline = time.monotonic() + 30
        while (final := client.responses.retrieve(response_id)).status == "in_progress":
            assert time.monotonic() < deadline, "the response was left in progress"
            time.sleep(0.2)
        assert final.status == "failed"
        assert final.error is not None and final.error.code == "server_error"
        assert final.error.message == GIVEN_UP_MESSAGE
        # What the first two batches said stays, and nothing of the third.
        assert final.output_text != "never told to the end"
        assert "never told to the end".startswith(final.output_text)
        with client.responses.stream(response_id=response_id) as stream:
            events = list(stream)
        assert [e.type for e in events][-2:] == ["error", "response.failed"]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert value(scrape(f"http://127.0.0.1:{metrics_port}"), "steno_parser_given_up_total") == 1
        while not asyncio.run(consumer_settled()):
            assert time.monotonic() < deadline, "the message was never acked"
            time.sleep(0.2)
        assert reparses_identically(stack.settings, response_id)
