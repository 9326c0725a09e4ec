"""Following responses' live events on real NATS: the responses an API process made
arrive on its one origin subscription; any other response on a subscription of its own.
Tailing a response against its log in Postgres: a gap in what is announced, and silence,
are read from the log; silence is marked by keepalives."""

import asyncio
import time

import nats
import pytest

from steno.schemas.events import CommittedEvents, LoggedEvent
from steno.schemas.ids import new_origin, new_response_id, origin_of
from steno.services.common.bus import Names
from steno.services.common.db import create_pool
from steno.services.edge import EventReader, ResponseTail

pytestmark = pytest.mark.integration


def committed(response_id: str, seq: int) -> bytes:
    event = LoggedEvent(seq=seq, type="response.output_text.delta", payload=f'{{"sequence_number":{seq}}}')
    return CommittedEvents(response_id=response_id, events=[event]).model_dump_json().encode()


@pytest.fixture
async def tail(settings):
    nc = await nats.connect(settings.nats_url)
    names = Names.from_settings(settings)
    origin = new_origin()
    following = ResponseTail(nc, None, names.events_subject, origin, names.origin_events(origin))
    await following.start()
    yield nc, names, origin, following
    await following.stop()
    await nc.close()


async def next_seqs(live, timeout_s: float = 2.0) -> list[int]:
    return [event.seq for event in (await asyncio.wait_for(live.queue.get(), timeout_s)).events]


def test_an_id_carries_its_origin():
    origin = new_origin()
    made_here = new_response_id(origin)
    assert origin_of(made_here) == origin and len(made_here) == len(new_response_id())
    assert origin_of(new_response_id()) != origin


async def test_responses_made_here_share_the_origin_subscription(tail):
    nc, names, origin, following = tail
    mine, other_of_mine = new_response_id(origin), new_response_id(origin)
    first, second = await following.listen(mine), await following.listen(mine)
    assert first.subscription is None and second.subscription is None  # no NATS subscription each
    await nc.publish(names.events_subject(other_of_mine), committed(other_of_mine, 5))
    await nc.publish(names.events_subject(mine), committed(mine, 1))
    assert await next_seqs(first) == [1] and await next_seqs(second) == [1]
    assert first.queue.empty()
    await first.close()
    await nc.publish(names.events_subject(mine), committed(mine, 2))
    assert await next_seqs(second) == [2]
    await second.close()
    assert following._following == {}  # nothing left behind for a finished stream


async def test_a_response_made_elsewhere_is_followed_on_its_own_subject(tail):
    nc, names, _, following = tail
    elsewhere = new_response_id()
    live = await following.listen(elsewhere)
    assert live.subscription is not None
    await nc.flush()  # the subscription is in place before the publish
    await nc.publish(names.events_subject(elsewhere), committed(elsewhere, 3))
    assert await next_seqs(live) == [3]
    await live.close()


@pytest.fixture
async def reading_tail(settings):
    """A tail that reads a real event log, and a way to store events in it unannounced."""
    nc = await nats.connect(settings.nats_url)
    pool = await create_pool(settings.database_url, max_size=2)
    names = Names.from_settings(settings)
    reading = ResponseTail(nc, EventReader(pool), names.events_subject)

    async def store(response_id: str, seqs: range, terminal_at: int | None = None) -> list[LoggedEvent]:
        def type_at(seq: int) -> str:
            return "response.completed" if seq == terminal_at else "response.output_text.delta"

        events = [LoggedEvent(seq=seq, type=type_at(seq), payload=f'{{"sequence_number":{seq}}}') for seq in seqs]
        await pool.executemany(
            "INSERT INTO response_events (response_id, seq, type, payload) VALUES ($1, $2, $3, $4)",
            [(response_id, e.seq, e.type, e.payload) for e in events])
        return events

    yield nc, names, reading, store
    await pool.close()
    await nc.close()


async def tailed(nc, reading: ResponseTail, **options):
    """A new response's id and its runs, listening before anything of it is stored."""
    response_id = new_response_id()
    live = await reading.listen(response_id)
    await nc.flush()  # the subscription is in place before any publish
    return response_id, reading.runs(response_id, live=live, known=[], **options)


async def test_a_gap_in_the_announcements_is_read_from_the_log(reading_tail):
    nc, names, reading, store = reading_tail
    response_id, runs = await tailed(nc, reading)
    stored = await store(response_id, range(0, 4))
    # Only the last commit's announcement arrives: the three before it were lost.
    await nc.publish(names.events_subject(response_id),
                     CommittedEvents(response_id=response_id, events=stored[3:]).model_dump_json().encode())
    assert [event.seq for event in await asyncio.wait_for(anext(runs), 5)] == [0, 1, 2, 3]
    await store(response_id, range(4, 6), terminal_at=5)
    await nc.publish(names.events_subject(response_id), committed(response_id, 5))  # 4's was lost
    assert [event.seq for event in await asyncio.wait_for(anext(runs), 5)] == [4, 5]
    with pytest.raises(StopAsyncIteration):  # the terminal event ends the runs
        await asyncio.wait_for(anext(runs), 5)


async def test_events_never_announced_are_found_by_the_poll(reading_tail):
    _, _, reading, store = reading_tail
    response_id = new_response_id()
    await store(response_id, range(0, 3), terminal_at=2)
    started = time.monotonic()
    runs = reading.runs(response_id, poll_interval_s=0.3, known=[])
    assert [event.seq for event in await asyncio.wait_for(anext(runs), 5)] == [0, 1, 2]
    assert time.monotonic() - started >= 0.25
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(runs), 5)


async def test_each_announcement_puts_the_poll_off(reading_tail):
    nc, names, reading, store = reading_tail
    response_id, runs = await tailed(nc, reading, poll_interval_s=0.3)
    await store(response_id, range(0, 1))
    await nc.publish(names.events_subject(response_id), committed(response_id, 0))
    assert [event.seq for event in await asyncio.wait_for(anext(runs), 5)] == [0]
    started = time.monotonic()
    await store(response_id, range(1, 2))  # never announced: only a poll finds it
    following = asyncio.ensure_future(anext(runs))
    for _ in range(2):  # announcements (here repeats, which the tail drops) while it waits
        await asyncio.sleep(0.15)
        await nc.publish(names.events_subject(response_id), committed(response_id, 0))
    assert [event.seq for event in await asyncio.wait_for(following, 5)] == [1]
    assert time.monotonic() - started >= 0.55  # the poll came an interval after the last one
    await runs.aclose()


async def test_silence_is_marked_by_keepalives_until_events_come(reading_tail):
    nc, names, reading, store = reading_tail
    response_id, runs = await tailed(nc, reading, poll_interval_s=30, keepalive_s=0.1)
    started = time.monotonic()
    assert await asyncio.wait_for(anext(runs), 5) == []
    assert await asyncio.wait_for(anext(runs), 5) == []
    assert time.monotonic() - started >= 0.19
    await store(response_id, range(0, 1))
    await nc.publish(names.events_subject(response_id), committed(response_id, 0))
    assert [event.seq for event in await asyncio.wait_for(anext(runs), 5)] == [0]
    await runs.aclose()
