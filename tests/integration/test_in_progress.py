"""Messages held through one in-progress timer, against a real JetStream consumer with
the services' ack wait: held, a message outlives its ack wait many times over; released
unacked (its holder gone), it is delivered again, alone."""

import asyncio
import secrets

import nats
import pytest
from nats.js.api import StreamConfig

from steno.services.common.bus import durable_pull_config
from steno.services.common.continuous_pull import ContinuousPull
from steno.services.common.in_progress import ACK_WAIT_S, BEAT_S, InProgress

pytestmark = pytest.mark.integration


async def test_held_messages_stay_and_released_ones_come_back_within_the_ack_wait(settings):
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

    async def beating() -> None:
        while True:
            await asyncio.sleep(BEAT_S)
            await held.beat()

    beats = asyncio.create_task(beating())
    try:
        for n in range(3):
            await js.publish(subject, f"m{n}".encode())
        first = await feed.next_messages(10)
        while len(first) < 3:
            first += await feed.next_messages(10)
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
        await feed.stop()
        await js.delete_stream(stream)
        await nc.close()
