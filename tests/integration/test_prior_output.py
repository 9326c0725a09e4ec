"""Reading back what earlier attempts published, against a real JetStream: everything
that is there, nothing that is not, and a read too slow to finish is an error, never a
shorter prefix (a worker continuing after fewer tokens than were published fails the
response)."""

import time

import pytest

from steno.schemas.bus import TokenBatch
from steno.schemas.ids import new_response_id
from steno.services.common import bus
from steno.services.worker.prior_output import PriorOutputUnread, read_prior_output

pytestmark = pytest.mark.integration


@pytest.fixture
async def jetstream(settings):
    names = bus.Names(settings.namespace + "prior", settings.token_partitions)
    nc = await bus.connect(settings, "test-prior-output")
    js = nc.jetstream()
    await bus.ensure_streams(js, names)
    yield js, names
    await bus.remove_namespace(js, names)
    await nc.close()


async def publish_batches(js, names, response_id: str, count: int) -> None:
    for number in range(count):
        batch = TokenBatch(response_id=response_id, attempt=0, batch_no=number, token_ids=[number, number + 100])
        await js.publish(names.tokens_subject(response_id), batch.model_dump_json().encode())


async def test_every_published_batch_is_read_back(jetstream):
    js, names = jetstream
    response_id = new_response_id()
    await publish_batches(js, names, response_id, 700)  # more than one read's batch
    prior = await read_prior_output(js, names, response_id)
    assert prior.token_ids == [token for number in range(700) for token in (number, number + 100)]
    assert not prior.ended


async def test_nothing_published_is_read_at_once(jetstream):
    js, names = jetstream
    started = time.monotonic()
    prior = await read_prior_output(js, names, new_response_id())
    assert prior.token_ids == [] and not prior.ended
    assert time.monotonic() - started < 0.5  # no wait for messages that cannot come


async def test_a_read_that_cannot_finish_in_time_raises(jetstream):
    js, names = jetstream
    response_id = new_response_id()
    await publish_batches(js, names, response_id, 3)
    with pytest.raises(PriorOutputUnread):
        await read_prior_output(js, names, response_id, patience_s=0)
