"""Publishing to JetStream with each PubAck awaited, against a real JetStream stream."""

import asyncio
import secrets

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import StreamConfig
from nats.js.errors import APIError, NoStreamResponseError

from steno.services.common.stored_publish import StoredPublisher

pytestmark = pytest.mark.integration


@pytest.fixture
async def stream(settings):
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    name = f"{settings.namespace.upper()}_PUBLISH_{secrets.token_hex(3).upper()}"
    subject = f"{settings.namespace}.publish.{secrets.token_hex(3)}"
    await js.add_stream(StreamConfig(name=name, subjects=[f"{subject}.>"]))
    publisher = StoredPublisher(nc)
    await publisher.start()
    yield nc, js, name, subject, publisher
    await publisher.stop()
    await js.delete_stream(name)
    await nc.close()


async def test_concurrent_publishes_are_each_stored_once_by_their_message_id(stream):
    _, js, name, subject, publisher = stream

    async def publish(n: int) -> None:
        await publisher.publish(f"{subject}.{n % 4}", f"message {n}".encode(), {"Nats-Msg-Id": f"m{n}"})

    await asyncio.gather(*(publish(n) for n in range(200)))
    await publish(7)  # a retry of one already stored
    info = await js.stream_info(name)
    assert info.state.messages == 200
    stored = await js.get_last_msg(name, f"{subject}.3")
    assert stored.data == b"message 199"


async def test_a_subject_no_stream_holds_raises_no_stream_response(stream, settings):
    publisher = stream[4]
    with pytest.raises(NoStreamResponseError):
        await publisher.publish(f"{settings.namespace}.nowhere.{secrets.token_hex(3)}", b"lost", {"Nats-Msg-Id": "x"})


async def test_a_refused_message_raises_the_stream_s_error(stream):
    _, _, _, subject, publisher = stream
    with pytest.raises(APIError) as refused:
        await publisher.publish(f"{subject}.0", b"elsewhere", {"Nats-Msg-Id": "y", "Nats-Expected-Stream": "OTHER"})
    assert refused.value.err_code == 10060  # expected stream does not match


async def test_a_reply_that_never_comes_times_out(stream, settings):
    nc = stream[0]
    silent = f"{settings.namespace}.silent.{secrets.token_hex(3)}"
    subscription = await nc.subscribe(silent)  # a responder that never answers
    publisher = StoredPublisher(nc, timeout_s=0.2)
    await publisher.start()
    try:
        with pytest.raises(NatsTimeoutError):
            await publisher.publish(silent, b"unheard", {"Nats-Msg-Id": "z"})
    finally:
        await publisher.stop()
        await subscription.unsubscribe()
