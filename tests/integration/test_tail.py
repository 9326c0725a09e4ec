"""Following responses' live events on real NATS: each API process receives the
announcements of the responses it made and of those it follows on one subscription;
following a response made elsewhere registers the process with the parsers. Tailing a
response against its log in Postgres: a gap in what is announced, and silence, are read
from the log; silence is marked by keepalives."""

import asyncio
import time

import nats
import pytest

from steno.schemas.events import AnnouncedEvents, CommittedEvents, LoggedEvent
from steno.schemas.ids import new_origin, new_response_id, origin_of
from steno.services.common.bus import Names, follower_registry
from steno.services.common.db import create_pool
from steno.services.common.followers import Followers, FollowRegistry, follow_key
from steno.services.edge import EventReader, ResponseTail

pytestmark = pytest.mark.integration


def committed(response_id: str, seq: int) -> CommittedEvents:
    event = LoggedEvent(seq=seq, type="response.output_text.delta", payload=f'{{"sequence_number":{seq}}}')
    return CommittedEvents(response_id=response_id, events=[event])


def announced(*entries: CommittedEvents) -> bytes:
    return AnnouncedEvents(committed=list(entries)).model_dump_json().encode()


@pytest.fixture
async def tail(settings):
    """A process's tail, with a parser's copy of the followers' bucket beside it."""
    nc = await nats.connect(settings.nats_url)
    names = Names.from_settings(settings)
    origin = new_origin()
    bucket = await follower_registry(nc.jetstream(), names)
    registry = FollowRegistry(bucket, origin)
    await registry.start()
    following = ResponseTail(nc, None, origin, names.events_subject(origin), registry)
    await following.start()
    parsers_copy = Followers()
    await parsers_copy.start(bucket, names.followers_bucket)
    await nc.flush()
    yield nc, names, origin, following, parsers_copy
    await parsers_copy.stop()
    await following.stop()
    await registry.stop()
    await nc.close()


async def next_seqs(live, timeout_s: float = 2.0) -> list[int]:
    return [event.seq for event in (await asyncio.wait_for(live.queue.get(), timeout_s)).events]


async def until(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return condition()


def test_an_id_carries_its_origin():
    origin = new_origin()
    made_here = new_response_id(origin)
    assert origin_of(made_here) == origin and len(made_here) == len(new_response_id())
    assert origin_of(new_response_id()) != origin


async def test_each_announcement_reaches_the_streams_following_its_responses(tail):
    nc, names, origin, following, parsers_copy = tail
    mine, other_of_mine = new_response_id(origin), new_response_id(origin)
    first, second = await following.listen(mine), await following.listen(mine)
    await nc.publish(names.events_subject(origin), announced(committed(other_of_mine, 5), committed(mine, 1)))
    assert await next_seqs(first) == [1] and await next_seqs(second) == [1]
    assert first.queue.empty()
    await first.close()
    await nc.publish(names.events_subject(origin), announced(committed(mine, 2)))
    assert await next_seqs(second) == [2]
    await second.close()
    assert following._following == {}  # nothing left behind for a finished stream
    assert parsers_copy.of(mine) == []  # the parsers need not be told of a response made here


async def test_following_a_response_made_elsewhere_tells_the_parsers_until_the_last_stream_ends(tail):
    nc, names, origin, following, parsers_copy = tail
    elsewhere = new_response_id()
    first, second = await following.listen(elsewhere), await following.listen(elsewhere)
    assert await until(lambda: parsers_copy.of(elsewhere) == [origin])
    await nc.publish(names.events_subject(origin), announced(committed(elsewhere, 3)))
    assert await next_seqs(first) == [3] and await next_seqs(second) == [3]
    await first.close()
    await asyncio.sleep(0.2)
    assert parsers_copy.of(elsewhere) == [origin]  # one of its streams still follows it
    await second.close()
    assert await until(lambda: parsers_copy.of(elsewhere) == [])
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await (await follower_registry(nc.jetstream(), names)).get(follow_key(elsewhere, origin))


@pytest.fixture
async def reading_tail(settings):
    """A tail that reads a real event log, and a way to store events in it unannounced."""
    nc = await nats.connect(settings.nats_url)
    pool = await create_pool(settings.database_url, max_size=2)
    names = Names.from_settings(settings)
    origin = new_origin()
    registry = FollowRegistry(await follower_registry(nc.jetstream(), names), origin)
    reading = ResponseTail(nc, EventReader(pool), origin, names.events_subject(origin), registry)
    await reading.start()

    async def store(response_id: str, seqs: range, terminal_at: int | None = None) -> list[LoggedEvent]:
        def type_at(seq: int) -> str:
            return "response.completed" if seq == terminal_at else "response.output_text.delta"

        events = [LoggedEvent(seq=seq, type=type_at(seq), payload=f'{{"sequence_number":{seq}}}') for seq in seqs]
        await pool.executemany(
            "INSERT INTO response_events (response_id, seq, type, payload) VALUES ($1, $2, $3, $4)",
            [(response_id, e.seq, e.type, e.payload) for e in events])
        return events

    async def announce(*entries: CommittedEvents) -> None:
        await nc.publish(names.events_subject(origin), announced(*entries))

    yield nc, reading, store, announce
    await reading.stop()
    await pool.close()
    await nc.close()


async def tailed(nc, reading: ResponseTail, **options):
    """A new response's id (made by the tail's process) and its runs, listening before
    anything of it is stored."""
    response_id = new_response_id(reading._origin)
    live = await reading.listen(response_id)
    await nc.flush()  # the subscription is in place before any publish
    return response_id, reading.runs(response_id, live=live, known=[], **options)


async def test_a_gap_in_the_announcements_is_read_from_the_log(reading_tail):
    nc, reading, store, announce = reading_tail
    response_id, runs = await tailed(nc, reading)
    stored = await store(response_id, range(0, 4))
    # Only the last commit's announcement arrives: the three before it were lost.
    await announce(CommittedEvents(response_id=response_id, events=stored[3:]))
    assert [event.seq for event in await asyncio.wait_for(anext(runs), 5)] == [0, 1, 2, 3]
    await store(response_id, range(4, 6), terminal_at=5)
    await announce(committed(response_id, 5))  # 4's was lost
    assert [event.seq for event in await asyncio.wait_for(anext(runs), 5)] == [4, 5]
    with pytest.raises(StopAsyncIteration):  # the terminal event ends the runs
        await asyncio.wait_for(anext(runs), 5)


async def test_events_never_announced_are_found_by_the_poll(reading_tail):
    _, reading, store, _ = reading_tail
    response_id = new_response_id()
    await store(response_id, range(0, 3), terminal_at=2)
    started = time.monotonic()
    runs = reading.runs(response_id, poll_interval_s=0.3, known=[])
    assert [event.seq for event in await asyncio.wait_for(anext(runs), 5)] == [0, 1, 2]
    assert time.monotonic() - started >= 0.25
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(runs), 5)


async def test_each_announcement_puts_the_poll_off(reading_tail):
    nc, reading, store, announce = reading_tail
    response_id, runs = await tailed(nc, reading, poll_interval_s=0.3)
    await store(response_id, range(0, 1))
    await announce(committed(response_id, 0))
    assert [event.seq for event in await asyncio.wait_for(anext(runs), 5)] == [0]
    started = time.monotonic()
    await store(response_id, range(1, 2))  # never announced: only a poll finds it
    following = asyncio.ensure_future(anext(runs))
    for _ in range(2):  # announcements (here repeats, which the tail drops) while it waits
        await asyncio.sleep(0.15)
        await announce(committed(response_id, 0))
    assert [event.seq for event in await asyncio.wait_for(following, 5)] == [1]
    assert time.monotonic() - started >= 0.55  # the poll came an interval after the last one
    await runs.aclose()


async def test_silence_is_marked_by_keepalives_until_events_come(reading_tail):
    nc, reading, store, announce = reading_tail
    response_id, runs = await tailed(nc, reading, poll_interval_s=30, keepalive_s=0.1)
    started = time.monotonic()
    assert await asyncio.wait_for(anext(runs), 5) == []
    assert await asyncio.wait_for(anext(runs), 5) == []
    assert time.monotonic() - started >= 0.19
    await store(response_id, range(0, 1))
    await announce(committed(response_id, 0))
    assert [event.seq for event in await asyncio.wait_for(anext(runs), 5)] == [0]
    await runs.aclose()
