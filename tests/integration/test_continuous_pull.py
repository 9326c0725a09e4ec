"""Standing pull requests (the parser's partitions, a worker's slots), against real JetStream consumers."""

import asyncio
import contextlib
import secrets
import time
from contextlib import asynccontextmanager

import nats
import pytest
from nats.js.api import StreamConfig

from steno.services.common.bus import durable_pull_config
from steno.services.common.continuous_pull import Arrivals, ContinuousPull, Credits

pytestmark = pytest.mark.integration


@pytest.fixture
async def consumer(settings):
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    stream = f"{settings.namespace.upper()}_PULL_{secrets.token_hex(3).upper()}"
    subject = f"{settings.namespace}.pull.{secrets.token_hex(3)}"
    await js.add_stream(StreamConfig(name=stream, subjects=[subject]))
    await js.add_consumer(stream, durable_pull_config("reader", subject, max_deliver=5, max_ack_pending=1000,
                                                      ack_wait_s=5))
    yield nc, js, stream, subject
    await js.delete_stream(stream)
    await nc.close()


@asynccontextmanager
async def reading(nc, stream, durable="reader", **options):
    feed = ContinuousPull(nc, stream, durable, **options)
    await feed.start()
    try:
        yield feed
    finally:
        await feed.stop()


async def receive(feed: ContinuousPull, count: int, timeout_s: float = 5.0) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        messages = await asyncio.wait_for(feed.next_messages(64), deadline - time.monotonic())
        for msg in messages:
            got.append(msg.data)
            await msg.ack()
    return got


async def delivered_after_waiting(feed: ContinuousPull, js, subject: str, body: bytes,
                                  waited_s: float) -> tuple[list[bytes], float]:
    """Publishes ``body`` once the reader has waited ``waited_s`` for a message: what it
    received, and how long after the publish."""
    waiting = asyncio.create_task(receive(feed, 1))
    await asyncio.sleep(waited_s)
    published = time.monotonic()
    await js.publish(subject, body)
    got = await waiting
    return got, time.monotonic() - published


async def test_messages_arrive_in_order_beyond_one_request_batch(consumer):
    nc, js, stream, subject = consumer
    async with reading(nc, stream, batch=8, expires_s=1.0) as feed:
        for i in range(30):
            await js.publish(subject, str(i).encode())
        assert await receive(feed, 30) == [str(i).encode() for i in range(30)]


async def test_a_message_after_the_request_expired_still_arrives_at_once(consumer):
    nc, js, stream, subject = consumer
    async with reading(nc, stream, batch=8, expires_s=0.3) as feed:
        # After a second the first request has expired and been renewed.
        got, took = await delivered_after_waiting(feed, js, subject, b"late", 1.0)
        assert got == [b"late"]
        assert took < 0.5


async def test_after_stop_the_next_reader_gets_what_the_first_left(consumer):
    nc, js, stream, subject = consumer
    async with reading(nc, stream, batch=8, expires_s=30.0):
        pass
    # The first reader's request is still open on the server, but nobody listens on it.
    async with reading(nc, stream, batch=8, expires_s=30.0) as second:
        published = time.monotonic()
        await js.publish(subject, b"for the next holder")
        assert await receive(second, 1) == [b"for the next holder"]
        assert time.monotonic() - published < 0.5


async def test_with_credits_no_more_is_delivered_than_was_released(consumer):
    nc, js, stream, subject = consumer
    credits = Credits(2)
    async with reading(nc, stream, batch=8, expires_s=0.3, credits=credits) as feed:
        for i in range(5):
            await js.publish(subject, str(i).encode())
        first = await receive(feed, 2)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(feed.next_messages(8), 0.8)  # two requests expire meanwhile
        credits.release()
        assert first + await receive(feed, 1) == [b"0", b"1", b"2"]
        info = await js.consumer_info(stream, "reader")
        assert info.num_pending == 2  # the rest waits in the stream, not here


async def test_a_request_hands_over_each_message_without_waiting_for_its_batch(consumer):
    nc, js, stream, subject = consumer
    async with reading(nc, stream, batch=32, expires_s=5.0, credits=Credits(32)) as feed:
        got, took = await delivered_after_waiting(feed, js, subject, b"one of many it asked for", 0.2)
        assert got == [b"one of many it asked for"]
        assert took < 0.5


async def test_stop_hands_back_what_arrived_but_was_not_taken(consumer):
    nc, js, stream, subject = consumer
    async with reading(nc, stream, batch=8, expires_s=5.0, credits=Credits(8)):
        await js.publish(subject, b"delivered, never taken")
        await asyncio.sleep(0.3)  # it reaches the first reader's inbox
    async with reading(nc, stream, batch=8, expires_s=0.3) as second:
        started = time.monotonic()
        # Not after the 5 s ack wait: the first reader handed it back.
        assert await receive(second, 1, timeout_s=3.0) == [b"delivered, never taken"]
        assert time.monotonic() - started < 3.0


async def test_after_a_reconnect_the_reader_renews_its_request(consumer, settings):
    _nc, js, stream, subject = consumer
    reader_nc = await nats.connect(settings.nats_url, reconnect_time_wait=0.5)
    try:
        async with reading(reader_nc, stream, batch=8, expires_s=30.0) as feed:
            waiting = asyncio.create_task(receive(feed, 1, timeout_s=10))
            await asyncio.sleep(0.2)
            # Drop the reader's connection the way a NATS restart would. Meanwhile a message
            # comes: JetStream finds nobody listening on the request and drops the request.
            reader_nc._transport.close()
            await asyncio.sleep(0.1)  # the server notices; the client returns after 0.5 s
            await js.publish(subject, b"sent while it was away")
            published = time.monotonic()
            assert await waiting == [b"sent while it was away"]
            assert time.monotonic() - published < 4  # not the request's 30 s
            assert reader_nc.stats["reconnects"] >= 1
    finally:
        await reader_nc.close()


@pytest.fixture
async def two_consumers(consumer):
    """The ``consumer`` fixture's stream with a second subject and its own consumer, ``other``."""
    nc, js, stream, subject = consumer
    other_subject = subject + "-other"
    await js.update_stream(StreamConfig(name=stream, subjects=[subject, other_subject]))
    await js.add_consumer(stream, durable_pull_config("other", other_subject, max_deliver=5, max_ack_pending=1000,
                                                      ack_wait_s=5))
    return nc, js, stream, subject, other_subject


async def test_pulls_sharing_arrivals_are_read_together(two_consumers):
    nc, js, stream, subject, other_subject = two_consumers
    arrivals = Arrivals()
    async with reading(nc, stream, batch=8, expires_s=0.3, arrivals=arrivals) as first, \
            reading(nc, stream, durable="other", batch=8, expires_s=0.3, arrivals=arrivals) as second:
        await js.publish(subject, b"first 0")
        await js.publish(other_subject, b"second 0")
        await asyncio.sleep(0.3)  # both reach their inboxes
        taken = await asyncio.wait_for(arrivals.next_messages(64), 2)
        assert sorted((pull is first, msg.data) for pull, msg in taken) == [(False, b"second 0"), (True, b"first 0")]
        for _, msg in taken:
            await msg.ack()
        # Both requests expire and are renewed while the reader waits on them together.
        waiting = asyncio.create_task(arrivals.next_messages(64))
        await asyncio.sleep(1.0)
        published = time.monotonic()
        await js.publish(other_subject, b"second 1")
        taken = await asyncio.wait_for(waiting, 2)
        assert [(pull is second, msg.data) for pull, msg in taken] == [(True, b"second 1")]
        assert time.monotonic() - published < 0.5


async def test_a_pull_stopped_hands_back_what_it_left_among_the_others_arrivals(two_consumers):
    nc, js, stream, subject, other_subject = two_consumers
    arrivals = Arrivals()
    async with reading(nc, stream, durable="other", batch=8, expires_s=5.0, arrivals=arrivals):
        async with reading(nc, stream, batch=8, expires_s=5.0, arrivals=arrivals):
            await js.publish(subject, b"delivered, never taken")
            await js.publish(other_subject, b"for the pull that stays")
            await asyncio.sleep(0.3)  # both reach the shared arrivals
        taken = await asyncio.wait_for(arrivals.next_messages(64), 2)
        assert [msg.data for _, msg in taken] == [b"for the pull that stays"]
        await taken[0][1].ack()
        async with reading(nc, stream, batch=8, expires_s=0.3) as next_holder:
            # Not after the 5 s ack wait: the stopped pull handed it back.
            assert await receive(next_holder, 1, timeout_s=3.0) == [b"delivered, never taken"]


async def test_pulls_sharing_credits_take_no_more_than_the_credits_and_their_open_requests(two_consumers):
    nc, js, stream, subject, other_subject = two_consumers
    credits = Credits(1)
    async with reading(nc, stream, batch=1, expires_s=0.3, credits=credits) as first, \
            reading(nc, stream, durable="other", batch=1, expires_s=0.3, credits=credits) as second:
        for i in range(3):
            await js.publish(subject, f"first {i}".encode())
            await js.publish(other_subject, f"second {i}".encode())
        # Each asked for the one free credit before either was used: one message each.
        assert await receive(first, 1) == [b"first 0"]
        assert await receive(second, 1) == [b"second 0"]
        assert credits.count == -1
        for feed in (first, second):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(feed.next_messages(1), 0.8)
        credits.release(2)
        assert len(await receive(first, 1)) == 1
        assert (await js.consumer_info(stream, "reader")).num_pending + \
            (await js.consumer_info(stream, "other")).num_pending == 3


async def test_a_reader_busy_between_reads_keeps_one_request_open_and_never_piles_them_up(consumer):
    """A request without credits is replaced halfway through its life, so a reader that
    reads at least that often always has one open, whatever it does in between; the
    replaced request's end notice, coming later, sends no other."""
    nc, js, stream, _ = consumer
    async with reading(nc, stream, batch=8, expires_s=0.6) as feed:
        open_requests = []
        for _ in range(12):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(feed.next_messages(8), 0.01)
            await asyncio.sleep(0.25)  # busy elsewhere, past the request's halfway
            open_requests.append((await js.consumer_info(stream, "reader")).num_waiting)
        assert min(open_requests) >= 1, open_requests
        assert max(open_requests) <= 2, open_requests
