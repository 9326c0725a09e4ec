"""``steno audit verify|replay|transcript`` over logs the real services stored: intact
logs verify, logs altered in Postgres fail naming the event, replays are the streams
clients received, transcripts hold exactly what each turn said."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import httpx
import openai
import orjson
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from steno.infra.processes import Stack, service_env
from steno.schemas.chain import event_hash
from tests.conftest import SLOW_MODEL, separate_stack

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
STREAM_EVENT: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)


def steno(stack: Stack, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "steno.services.cli", "audit", *args],
                          env={**service_env(stack.settings), **(env or {})}, capture_output=True, text=True,
                          timeout=120, check=False)


def raw_stream(stack: Stack, body: dict) -> bytes:
    """The exact bytes a streaming client receives."""
    with httpx.stream("POST", stack.base_url + "/responses", json={**body, "stream": True}, headers=stack.headers(),
                      timeout=30) as reply:
        return reply.read()


def response_id_of(body: bytes) -> str:
    first = body.split(b"\n\n")[0]
    data = next(line for line in first.split(b"\n") if line.startswith(b"data: "))
    return orjson.loads(data[6:])["response"]["id"]


def without_comments(sse: bytes) -> bytes:
    """An SSE text less its comment lines (keepalives, stored times): what a client parses."""
    return b"".join(line for line in sse.splitlines(keepends=True) if not line.startswith(b":"))


def tool_round_trip(client: openai.OpenAI) -> tuple:
    asked = client.responses.create(model=MODEL, input="Paris", tools=[WEATHER])
    call = asked.output[-1]
    assert call.type == "function_call"
    answered = client.responses.create(
        model=MODEL, tools=[WEATHER], previous_response_id=asked.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C"}])
    assert answered.output_text == "Steno simulator reply: the tool returned sunny, 21C"
    return asked, answered


async def test_intact_responses_verify_and_chain_to_their_previous_response(stack, client, db):
    asked, answered = tool_round_trip(client)
    for response in (asked, answered):
        verified = steno(stack, "verify", response.id)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert verified.stdout.count("\n") == 1 and "intact" in verified.stdout
        assert "byte-identical" in verified.stdout and "fold = stored snapshot" in verified.stdout
    last = await db.fetchrow("SELECT seq, hash FROM response_events WHERE response_id = $1 ORDER BY seq DESC LIMIT 1",
                             asked.id)
    link = await db.fetchrow("SELECT chained_to_response_id, chained_to_seq, chained_to_hash FROM responses"
                             " WHERE id = $1", answered.id)
    assert tuple(link) == (asked.id, last["seq"], last["hash"])
    first = await db.fetchrow("SELECT payload, hash FROM response_events WHERE response_id = $1 AND seq = 0",
                              answered.id)
    assert first["hash"] == hashlib.sha256(last["hash"] + first["payload"].encode()).digest()
    assert f"chained to {asked.id} seq {last['seq']}" in steno(stack, "verify", answered.id).stdout
    # Every event of both carries its link.
    rows = await db.fetch("SELECT response_id, seq, payload, hash FROM response_events"
                          " WHERE response_id = ANY($1) ORDER BY response_id, seq", [asked.id, answered.id])
    by_response: dict[str, list] = {}
    for row in rows:
        by_response.setdefault(row["response_id"], []).append(row)
    for events in by_response.values():
        for before, event in itertools.pairwise(events):
            assert event["hash"] == event_hash(before["hash"], event["payload"])


def test_a_response_still_running_verifies_as_far_as_it_has_gone(stack, client):
    job = client.responses.create(model=SLOW_MODEL, input="slowly " * 20, background=True)
    for _ in range(100):
        if client.responses.retrieve(job.id).output:
            break
        time.sleep(0.1)
    verified = steno(stack, "verify", job.id)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "still running" in verified.stdout or "fold = stored snapshot" in verified.stdout
    with contextlib.suppress(openai.BadRequestError):  # it may have finished meanwhile
        client.responses.cancel(job.id)


async def _altered_payload(db, rid: str) -> int:
    seq = await db.fetchval("SELECT min(seq) FROM response_events WHERE response_id = $1 AND seq > 0"
                            " AND type = 'response.output_text.delta'", rid)
    await db.execute("UPDATE response_events SET payload = replace(payload, '\"delta\":\"', '\"delta\":\"forged ')"
                     " WHERE response_id = $1 AND seq = $2", rid, seq)
    return seq


async def _altered_tokens(db, rid: str) -> int:
    """One token of the answer's text replaced by the next one in the vocabulary: the
    first event the re-parse changes is that text's delta."""
    text = await db.fetchval("SELECT payload FROM response_events WHERE response_id = $1"
                             " AND type = 'response.output_text.done'", rid)
    answer = orjson.loads(text)["text"]
    batches = await db.fetch("SELECT attempt, batch_no, token_ids FROM response_tokens WHERE response_id = $1"
                             " ORDER BY attempt, batch_no", rid)
    deltas = await db.fetch("SELECT seq, payload FROM response_events WHERE response_id = $1"
                            " AND type = 'response.output_text.delta' ORDER BY seq", rid)
    # The answer's last word: the last ordinary token (below Harmony's special ones) of
    # the last batch that has one, whether the answer came in many batches or in one
    # with its header and end (a slow machine's full-speed simulator sends it whole).
    last_delta = deltas[-1]
    victim = next(b for b in reversed(batches) if any(token < 199_998 for token in b["token_ids"]))
    position = max(i for i, token in enumerate(victim["token_ids"], start=1) if token < 199_998)
    assert answer
    await db.execute("UPDATE response_tokens SET token_ids[$4] = token_ids[$4] + 1"
                     " WHERE response_id = $1 AND attempt = $2 AND batch_no = $3", rid, victim["attempt"],
                     victim["batch_no"], position)
    return last_delta["seq"]


async def _swapped(db, rid: str) -> int:
    for move in ((3, -1), (4, 3), (-1, 4)):
        await db.execute("UPDATE response_events SET seq = $3 WHERE response_id = $1 AND seq = $2", rid, *move)
    return 3


async def _altered_hash(db, rid: str) -> int:
    await db.execute("UPDATE response_events SET hash = sha256('forged') WHERE response_id = $1 AND seq = 5", rid)
    return 5


@pytest.mark.parametrize("alter", [_altered_payload, _altered_tokens, _swapped, _altered_hash],
                         ids=["payload", "token-batch", "order", "hash"])
async def test_an_altered_log_fails_naming_the_first_bad_event(stack, db, alter):
    body = raw_stream(stack, {"model": MODEL, "input": "verify me, déjà vu 日本, and then some more words"})
    rid = response_id_of(body)
    assert steno(stack, "verify", rid).returncode == 0
    seq = await alter(db, rid)
    verified = steno(stack, "verify", rid)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert verified.stdout, verified.stderr
    first_line = verified.stdout.splitlines()[0]
    if alter is _altered_tokens:
        # The changed token may not change a delta before the batch's own.
        named = int(first_line.split("FAILED at seq ")[1].split(" ")[0])
        assert 0 < named <= seq and "re-parse" in first_line, first_line
    else:
        assert first_line.startswith(f"{rid}: FAILED at seq {seq} ("), first_line


async def test_the_chain_between_responses_shows_a_rewritten_previous_log(stack, client, db):
    since = datetime.now(UTC) - timedelta(seconds=1)
    asked, answered = tool_round_trip(client)
    everything = steno(stack, "verify", "--all", "--since", since.isoformat())
    assert everything.returncode == 0, everything.stdout + everything.stderr
    assert everything.stdout.count("\n") == 1 and "all intact" in everything.stdout
    # Rewrite the first response's last event with a consistent hash of its own: only the
    # link from the response that continued it can tell.
    last = await db.fetchrow("SELECT seq, payload FROM response_events WHERE response_id = $1 ORDER BY seq DESC"
                             " LIMIT 1", asked.id)
    before = await db.fetchval("SELECT hash FROM response_events WHERE response_id = $1 AND seq = $2",
                               asked.id, last["seq"] - 1)
    forged = last["payload"].replace('"status":"completed"', '"status":"completed" ', 1)
    await db.execute("UPDATE response_events SET payload = $3, hash = $4 WHERE response_id = $1 AND seq = $2",
                     asked.id, last["seq"], forged, event_hash(before, forged))
    continued = steno(stack, "verify", answered.id)
    assert continued.returncode == 1
    assert continued.stdout.startswith(f"{answered.id}: FAILED at seq 0 (response.created): chained to {asked.id}")
    everything = steno(stack, "verify", "--all", "--since", since.isoformat())
    assert everything.returncode == 1
    assert f"{asked.id}: FAILED at seq {last['seq']}" in everything.stdout
    assert f"{answered.id}: FAILED at seq 0" in everything.stdout
    assert everything.stdout.splitlines()[-1].endswith("2 of 2 responses FAILED")


def test_a_conversation_verifies_and_its_turns_chain(stack, client):
    conversation = client.conversations.create(metadata={"topic": "weather"})
    first = client.responses.create(model=MODEL, input="Paris", tools=[WEATHER], conversation=conversation.id)
    call = first.output[-1]
    second = client.responses.create(
        model=MODEL, tools=[WEATHER], conversation=conversation.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "rainy, 12C"}])
    assert second.output_text == "Steno simulator reply: the tool returned rainy, 12C"
    verified = steno(stack, "verify", "--conversation", conversation.id)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith(f"conversation {conversation.id}: 2 responses, ")
    assert verified.stdout.endswith("events: all intact\n") and verified.stdout.count("\n") == 1
    assert f"chained to {first.id}" in steno(stack, "verify", second.id).stdout
    transcript = orjson.loads(steno(stack, "transcript", conversation.id, "--format", "json").stdout)
    assert [turn["response_id"] for turn in transcript["turns"]] == [first.id, second.id]
    assert transcript["turns"][1]["input"][0]["output"] == "rainy, 12C"
    assert transcript["turns"][1]["output"][-1]["content"][0]["text"] == second.output_text


def test_replay_is_the_stream_the_client_received(stack, client):
    body = raw_stream(stack, {"model": MODEL, "input": "replay me: déjà vu 日本\u2028and a line separator",
                              "tools": [WEATHER]})
    rid = response_id_of(body)
    replayed = steno(stack, "replay", rid)
    assert replayed.returncode == 0, replayed.stderr
    sse = replayed.stdout.encode()
    assert without_comments(sse) == without_comments(body)
    times = [line for line in sse.splitlines() if line.startswith(b": stored ")]
    assert len(times) == body.count(b"\nid: ")
    stamps = [datetime.fromisoformat(line[len(b": stored "):].decode().replace("Z", "+00:00")) for line in times]
    assert stamps == sorted(stamps) and stamps[0] > datetime.now(UTC) - timedelta(minutes=5)

    # What the SDK streamed for the same response, event by event.
    streamed = list(client.responses.retrieve(rid, stream=True))
    lines = [orjson.loads(line) for line in steno(stack, "replay", rid, "--format", "jsonl").stdout.splitlines()]
    assert [line["seq"] for line in lines] == [event.sequence_number for event in streamed]
    assert [line["event"] for line in lines] == [event.to_dict() for event in streamed]
    assert all(isinstance(STREAM_EVENT.validate_python(line["event"]), type(event))
               for line, event in zip(lines, streamed))
    assert all(len(line["hash"]) == 64 for line in lines)


def test_transcript_of_a_chain_holds_exactly_its_inputs_and_outputs(stack, client):
    asked, answered = tool_round_trip(client)
    transcript = steno(stack, "transcript", answered.id, "--format", "json")
    assert transcript.returncode == 0, transcript.stderr
    turns = orjson.loads(transcript.stdout)["turns"]
    assert [turn["response_id"] for turn in turns] == [asked.id, answered.id]
    assert turns[1]["previous_response_id"] == asked.id
    with httpx.Client(base_url=stack.base_url, headers=stack.headers(), timeout=30) as http:
        for turn, response in zip(turns, (asked, answered)):
            inputs = http.get(f"/responses/{response.id}/input_items", params={"order": "asc"}).json()["data"]
            stored = http.get(f"/responses/{response.id}").json()
            assert turn["input"] == inputs
            assert turn["output"] == stored["output"]
            assert (turn["model"], turn["status"]) == (MODEL, "completed")
    call = turns[0]["output"][-1]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    [result] = turns[1]["input"]
    assert (result["type"], result["call_id"], result["output"]) == ("function_call_output", call["call_id"],
                                                                     "sunny, 21C")

    markdown = steno(stack, "transcript", answered.id).stdout
    assert markdown.startswith(f"# Transcript of previous_response_id chain ending at {answered.id}")
    for text in ("## Turn 1: " + asked.id, "**tool call get_weather (" + call["call_id"] + ")**",
                 call["arguments"], "sunny, 21C", answered.output_text, "> Paris"):
        assert text in markdown, text


def test_unknown_ids_are_a_clear_error(stack):
    for args in (["verify", "resp_nothing"], ["replay", "resp_nothing"], ["transcript", "conv_nothing"]):
        done = steno(stack, *args)
        assert done.returncode == 2 and "no " in done.stderr


def test_a_chat_template_response_verifies_with_files_fetched_from_the_bus(settings, tmp_path_factory):
    """Neither the API, the parser nor the audit has a model directory; the audit's
    local model files directory starts empty, so it fetches the files the worker
    published."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STENO_MODEL_FILES_DIR", str(tmp_path_factory.mktemp("services-model-files")))
        with separate_stack(settings, "auditchat", tmp_path_factory.mktemp("audit-chat-logs")) as chat:
            chat.add("parser", "parser")
            chat.add("worker-qwen3", "worker", "--model", "sim-qwen3", "--sim-dialect", "qwen3",
                     "--sim-tokens-per-s", "0")
            chat.add_api()
            sdk = openai.OpenAI(base_url=chat.base_url, api_key=chat.keys["a"], max_retries=0, timeout=60)
            asked = sdk.responses.create(model="sim-qwen3", input="Paris", tools=[WEATHER])
            call = next(item for item in asked.output if item.type == "function_call")
            answered = sdk.responses.create(
                model="sim-qwen3", previous_response_id=asked.id, tools=[WEATHER],
                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
            empty = {"STENO_MODEL_FILES_DIR": str(tmp_path_factory.mktemp("audit-model-files"))}
            for response in (asked, answered):
                verified = steno(chat, "verify", response.id, env=empty)
                assert verified.returncode == 0, verified.stdout + verified.stderr
                assert "byte-identical" in verified.stdout and "hash chain unbroken" in verified.stdout
            assert f"chained to {asked.id}" in steno(chat, "verify", answered.id, env=empty).stdout


async def test_restore_writes_back_missing_events_with_their_hashes(stack, db):
    rid = response_id_of(raw_stream(stack, {"model": MODEL, "input": "restore me"}))
    query = "SELECT seq, type, payload, hash FROM response_events WHERE response_id = $1 ORDER BY seq"
    before = [tuple(row) for row in await db.fetch(query, rid)]
    await db.execute("DELETE FROM response_events WHERE response_id = $1 AND seq BETWEEN 2 AND 4", rid)
    failed = steno(stack, "verify", rid)
    assert failed.returncode == 1 and failed.stdout.startswith(f"{rid}: FAILED at seq 2 ("), failed.stdout
    restored = steno(stack, "verify", rid, "--restore")
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "3 missing events restored" in restored.stdout
    assert [tuple(row) for row in await db.fetch(query, rid)] == before


async def test_a_fifty_turn_agent_session_transcribes_to_exactly_what_was_said_and_verifies(stack, monkeypatch):
    """The Agents SDK's conversation session, fifty turns each with a tool call: the
    conversation's transcript holds exactly the session's items, and every response the
    run made verifies."""
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    import agents

    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0, timeout=60)

    def look_up_order(order_id: str) -> str:
        """Look up where an order is."""
        return f"order {order_id} shipped on Tuesday"

    clerk = agents.Agent(name="clerk", instructions="Answer questions about orders.",
                         model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
                         tools=[agents.function_tool(look_up_order)])
    session = agents.OpenAIConversationsSession(openai_client=client)
    run_config = agents.RunConfig(tracing_disabled=True)
    started = datetime.now(UTC) - timedelta(seconds=1)
    made: list[str] = []
    try:
        for turn in range(50):
            result = await agents.Runner.run(clerk, f"order O-{turn}", session=session, run_config=run_config)
            assert result.final_output.endswith(f"order O-{turn} shipped on Tuesday")
            made += [response.response_id for response in result.raw_responses]
        said = await session.get_items()
        conversation_id = session.session_id
    finally:
        await client.close()
    assert len(made) == 100 and len(said) == 50 * 6

    transcript = steno(stack, "transcript", conversation_id, "--format", "json")
    assert transcript.returncode == 0, transcript.stderr
    turns = orjson.loads(transcript.stdout)["turns"]
    transcribed = [item for turn in turns for item in [*turn["input"], *turn["output"]]]
    assert transcribed == said

    # Every response since the run began: the run's hundred (and any a concurrent test made).
    verified = steno(stack, "verify", "--all", "--since", started.isoformat())
    assert verified.returncode == 0, verified.stdout + verified.stderr
    checked = int(verified.stdout.split(": ")[1].split(" responses")[0])
    assert checked >= len(made) and verified.stdout.rstrip().endswith("all intact")
