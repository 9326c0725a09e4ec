"""Compaction: a minute after a response ends, the sweep moves its events from a row each
into one chunk row (migration 0012); replaying, resuming, retrieving, auditing and
deleting it see no difference, byte for byte, through the real stack and the real
``steno retention sweep`` command."""

import asyncio
import contextlib

import httpx
import openai
import pytest

from tests.conftest import SLOW_MODEL, reparses_identically
from tests.integration.test_parser_log import publish_stored_batches_again
from tests.integration.test_retention import steno

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def raw_stream(stack, response_id: str, after: int | None = None) -> bytes:
    params = {"stream": "true"} if after is None else {"stream": "true", "starting_after": str(after)}
    with httpx.stream("GET", f"{stack.base_url}/responses/{response_id}", params=params, headers=stack.headers(),
                      timeout=30) as reply:
        assert reply.status_code == 200
        return reply.read()


async def rows(db, response_id: str) -> tuple[int, int]:
    """The response's event rows and chunk rows."""
    return (await db.fetchval("SELECT count(*) FROM response_events WHERE response_id = $1", response_id),
            await db.fetchval("SELECT count(*) FROM response_event_chunks WHERE response_id = $1", response_id))


async def ended_minutes_ago(db, response_ids: list[str], minutes: int) -> None:
    await db.execute("UPDATE responses SET completed_at = completed_at - make_interval(mins => $2)"
                     " WHERE id = ANY($1::text[])", response_ids, minutes)


async def test_a_compacted_response_replays_resumes_and_verifies_byte_for_byte(stack, client, db):
    answered = client.responses.create(model=MODEL, input="compact me " * 30)
    called = client.responses.create(model=MODEL, input="Paris", tools=[WEATHER])
    done = [answered.id, called.id]
    running = client.responses.create(model=SLOW_MODEL, input="still going " * 40, background=True)
    before = {rid: raw_stream(stack, rid) for rid in done}
    resumed_before = raw_stream(stack, answered.id, after=5)
    counted = {rid: (await rows(db, rid))[0] for rid in done}
    assert all(count > 5 for count in counted.values())

    await ended_minutes_ago(db, done, 2)
    swept = steno(stack, "retention", "sweep")
    assert swept.returncode == 0, swept.stderr
    assert "compacted the events of" in swept.stdout

    for rid in done:
        assert await rows(db, rid) == (0, 1)
        assert await db.fetchval("SELECT count(*) FROM response_log WHERE response_id = $1", rid) == counted[rid]
        assert raw_stream(stack, rid) == before[rid]
        assert await asyncio.to_thread(reparses_identically, stack.settings, rid)
    assert raw_stream(stack, answered.id, after=5) == resumed_before
    assert client.responses.retrieve(answered.id).output_text == answered.output_text
    # A follow-up chains from the compacted response as from any other.
    follow = client.responses.create(model=MODEL, input="and then?", previous_response_id=answered.id)
    assert follow.status == "completed"
    # What has not ended, or ended less than a minute ago, keeps its rows.
    assert (await rows(db, running.id))[1] == 0
    assert (await rows(db, follow.id)) [1] == 0
    with contextlib.suppress(openai.BadRequestError):  # it may have completed by now on a slow machine
        client.responses.cancel(running.id)


async def test_a_compacted_response_is_deleted_with_its_chunk(stack, client, db):
    done = client.responses.create(model=MODEL, input="compact, then delete")
    await ended_minutes_ago(db, [done.id], 2)
    assert steno(stack, "retention", "sweep").returncode == 0
    assert await rows(db, done.id) == (0, 1)
    client.responses.delete(done.id)
    assert await rows(db, done.id) == (0, 0)


async def test_batches_delivered_again_after_compaction_add_no_events(stack, client, db, settings):
    """A redelivery long after the end meets no row key (the events are in a chunk): the
    commit's retry skips what the chunk holds, so the log keeps each event once."""
    done = client.responses.create(model=MODEL, input="compacted, then delivered again")
    before = raw_stream(stack, done.id)
    await ended_minutes_ago(db, [done.id], 2)
    assert steno(stack, "retention", "sweep").returncode == 0
    assert await rows(db, done.id) == (0, 1)

    await publish_stored_batches_again(db, settings, done.id)

    assert await rows(db, done.id) == (0, 1)
    seqs = [r[0] for r in await db.fetch("SELECT seq FROM response_log WHERE response_id = $1 ORDER BY seq", done.id)]
    assert seqs == list(range(len(seqs)))
    assert raw_stream(stack, done.id) == before
