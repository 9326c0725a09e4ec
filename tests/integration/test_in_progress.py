"""Messages held through one in-progress timer, against a real JetStream consumer with
the services' ack wait: held, a message outlives its ack wait many times over; released
unacked (its holder gone), it is delivered again, alone; held by a holder frozen past
the ack wait, it is another delivery's, and the holder knows it; a holder stopped for
good takes in none of its redeliveries."""

import asyncio
import contextlib
import secrets

import nats
import pytest
from nats.js.api import StreamConfig

from steno.services.common.bus import durable_pull_config
from steno.services.common.continuous_pull import ContinuousPull
from steno.services.common.in_progress import ACK_WAIT_S, BEAT_S, InProgress

pytestmark = pytest.mark.integration


@pytest.fixture
async def holder(settings):
    """A holder of a fresh consumer with the services' ack wait: the JetStream context,
    the consumer's subject, what it holds, and its pull; and a reader of the same
    consumer beside it, started on demand."""
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    stream = f"{settings.namespace.upper()}_HELD_{secrets.token_hex(3).upper()}"
    subject = f"{settings.namespace}.held.{secrets.token_hex(3)}"
    await js.add_stream(StreamConfig(name=stream, subjects=[subject]))
    await js.add_consumer(stream, durable_pull_config("holder", subject, max_deliver=5, max_ack_pending=100,
                                                      ack_wait_s=ACK_WAIT_S))
    held = InProgress()
    feed = ContinuousPull(nc, stream, "holder", batch=10, held=held)
    await feed.start()
    beside = ContinuousPull(nc, stream, "holder", batch=10)
    try:
        yield js, subject, held, feed, beside
    finally:
        if beside.receiving:
            await beside.stop()
        await feed.stop()
        await js.delete_stream(stream)
        await nc.close()


async def received(feed: ContinuousPull, count: int) -> list:
    messages = await asyncio.wait_for(feed.next_messages(10), 5 * ACK_WAIT_S)
    while len(messages) < count:
        messages += await asyncio.wait_for(feed.next_messages(10), 5 * ACK_WAIT_S)
    return messages


async def test_held_messages_stay_and_released_ones_come_back_within_the_ack_wait(holder):
    js, subject, held, feed, _ = holder

    beats = asyncio.create_task(held.keep())
    try:
        for n in range(3):
            await js.publish(subject, f"m{n}".encode())
        first = await received(feed, 3)
        assert len(held) == 3  # held from their arrival, before anyone took them
        await asyncio.sleep(4 * ACK_WAIT_S)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(feed.next_messages(10), 0.5)
        assert [m.metadata.num_delivered for m in first] == [1, 1, 1]

        await first[0].ack()
        held.release(first[0])
        held.release(first[1])  # as if its holder died: no ack, no more beats
        again = await asyncio.wait_for(feed.next_messages(10), 5 * ACK_WAIT_S)
        assert [(m.data, m.metadata.num_delivered) for m in again] == [(b"m1", 2)]
    finally:
        beats.cancel()
        await asyncio.gather(beats, return_exceptions=True)


async def test_a_holder_late_past_the_ack_wait_knows_its_ack_is_not_its_own_to_give(holder):
    """A holder that stops beating for longer than the ack wait loses its message to
    another delivery, and an ack from the lapsed delivery would settle that one too (so
    it must not ack): a message another delivery still holds comes back once that holder
    goes, one that the lapsed delivery acked never does."""
    js, subject, held, feed, _ = holder
    for n in range(2):
        await js.publish(subject, f"m{n}".encode())
    first = await received(feed, 2)
    for _ in range(2 * round(ACK_WAIT_S / BEAT_S)):
        await asyncio.sleep(BEAT_S)
        await held.beat()
    assert not any(held.lapsed(m) for m in first)  # beaten on time: still this holder's

    await asyncio.sleep(ACK_WAIT_S)  # frozen past the ack wait, without a beat
    again = await received(feed, 2)
    await held.beat()  # thawed, it beats again: the lapse is remembered
    assert all(held.lapsed(m) for m in first)
    assert sorted((m.data, m.metadata.num_delivered) for m in again) == [(b"m0", 2), (b"m1", 2)]

    await first[0].ack()  # what a lapsed holder must not do
    for message in [*first, *again]:
        held.release(message)  # both holders gone, the second delivery unacked
    third = await received(feed, 1)
    assert [(m.data, m.metadata.num_delivered) for m in third] == [(b"m1", 3)]
    await third[0].ack()
    with pytest.raises(TimeoutError):  # and m0 never comes back
        await asyncio.wait_for(feed.next_messages(10), 3 * ACK_WAIT_S)


async def test_a_stopped_holder_takes_in_none_of_the_redeliveries_of_what_it_held(holder):
    """A holder stopped (frozen, paused by its host) neither beats nor reads: its open
    request ends before what it held lapses, so every later delivery goes to the reader
    still running, none back to it to lapse unread. A longer-lived request took them in
    turn with the live one's, and a message could spend its every delivery there."""
    js, subject, _, stopped, live = holder
    await js.publish(subject, b"m")
    [first] = await received(stopped, 1)  # from here on it neither beats nor reads
    await live.start()
    seen: list[int] = []
    with contextlib.suppress(TimeoutError):
        while len(seen) < 4:  # the consumer's max_deliver is 5
            seen += [m.metadata.num_delivered for m in await asyncio.wait_for(live.next_messages(10), 3 * ACK_WAIT_S)]
    assert seen == [2, 3, 4, 5]
    assert first.metadata.num_delivered == 1
