"""Token batches of several responses in one message (``TokenBatchGroup``), on real
NATS and Postgres: the parser writes each response's events as it would from messages
of their own, and a group one of whose batches must wait holds back none of the others'
events, nor writes any of them twice."""

import asyncio

import asyncpg
import orjson
import pytest

from steno.services.common.bus import Names, partition_of
from tests.events_oracle import validate_events
from tests.token_streams import create, neighbours, publish_alone, publish_grouped, statuses, stream_of

pytestmark = pytest.mark.integration

# Long enough for several batches of four tokens each.
FIRST = "the first response goes on through every one of its batches"
SECOND = "the second response waits a while for a batch that comes late"


async def recorded(settings, ids: list[str], texts: list[str]) -> None:
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    try:
        for rid, text in zip(ids, texts, strict=True):
            await create(pool, rid, text)
    finally:
        await pool.close()


async def payloads(db, rid: str) -> list[str]:
    rows = await db.fetch("SELECT payload FROM response_log WHERE response_id = $1 ORDER BY seq", rid)
    return [row[0] for row in rows]


async def settled(settings, rid: str) -> None:
    """Until the parser has acked everything on the response's partition."""
    import nats

    names = Names.from_settings(settings)
    nc = await nats.connect(settings.nats_url.split(","))
    try:
        js = nc.jetstream()
        consumer = names.parser_consumer(partition_of(rid, settings.token_partitions))
        for _ in range(200):
            info = await js.consumer_info(names.tokens_stream, consumer)
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"the parser left {info.num_pending} pending, {info.num_ack_pending} unacked")
    finally:
        await nc.close()


async def test_grouped_batches_make_each_responses_events(stack, settings, client, db):
    ids = neighbours(settings, 3)
    texts = [f"grouped answer {n} of three" for n in range(3)]
    await recorded(settings, ids, texts)
    await publish_grouped(settings, [stream_of(rid, text) for rid, text in zip(ids, texts, strict=True)])
    assert await statuses(db, ids, len(ids)) == dict.fromkeys(ids, "completed")
    await settled(settings, ids[0])
    for rid, text in zip(ids, texts, strict=True):
        assert client.responses.retrieve(rid).output_text == text
        events = validate_events(await payloads(db, rid))
        assert [event.sequence_number for event in events] == list(range(len(events)))
        assert events[-1].type == "response.completed"


async def test_a_group_with_a_batch_ahead_writes_the_others_once_and_waits_for_the_rest(stack, settings, client,
                                                                                         db):
    """The second response's batch 1 is left out of the groups: its batch 2 arrives
    ahead in a group beside the first response's, which goes on; the group comes again
    until batch 1 arrives alone, and every event of both is in the log once."""
    first, second = neighbours(settings, 2)
    streams = [stream_of(first, FIRST), stream_of(second, SECOND)]
    await recorded(settings, [first, second], ["one", "two"])
    await publish_grouped(settings, streams, skip={(second, 1)})
    assert await statuses(db, [first], 1) == {first: "completed"}
    assert len(streams[1]) > 2  # a batch comes after the one left out
    assert (await db.fetchval("SELECT status FROM responses WHERE id = $1", second)) != "completed"
    await publish_alone(settings, streams[1][1])
    assert await statuses(db, [first, second], 2) == {first: "completed", second: "completed"}
    await settled(settings, first)
    for rid, text in ((first, FIRST), (second, SECOND)):
        assert client.responses.retrieve(rid).output_text == text
        stored = await payloads(db, rid)
        events = validate_events(stored)
        assert [orjson.loads(payload)["sequence_number"] for payload in stored] == list(range(len(stored)))
        assert [event.type for event in events].count("response.completed") == 1
