"""Reading back what earlier attempts published, against a real JetStream: everything
that is there, nothing that is not, and a read too slow to finish is an error, never a
shorter prefix (a worker continuing after fewer tokens than were published fails the
response)."""

import datetime
import time

import pytest

from steno.schemas.bus import GroupedBatch, TokenBatch, TokenBatchGroup
from steno.schemas.ids import new_response_id
from steno.services.common import bus
from steno.services.worker.prior_output import PriorOutputUnread, read_prior_output
from tests.conftest import namespace_of_its_own

pytestmark = pytest.mark.integration


@pytest.fixture
async def jetstream(settings):
    async with namespace_of_its_own(settings, "prior") as (names, nc):
        yield nc.jetstream(), names


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


async def test_batches_grouped_with_other_responses_are_read_back_in_order(jetstream):
    """Batches 0 and 3 on the response's own subject, 1 and 2 in groups beside another
    response's batches: read back in the order they were stored."""
    js, names = jetstream
    response_id, other = new_response_id(), new_response_id()
    group_subject = names.tokens_group_subject(bus.partition_of(response_id, names.token_partitions))
    queued = datetime.datetime.now(datetime.UTC)

    def batch(rid: str, number: int) -> TokenBatch:
        return TokenBatch(response_id=rid, attempt=0, batch_no=number, token_ids=[number, number + 100])

    await js.publish(names.tokens_subject(response_id), batch(response_id, 0).model_dump_json().encode())
    for number in (1, 2):
        group = TokenBatchGroup(batches=[GroupedBatch(batch=batch(other, number)),
                                         GroupedBatch(batch=batch(response_id, number))])
        await js.publish(group_subject, group.model_dump_json().encode())
    await js.publish(names.tokens_subject(response_id), batch(response_id, 3).model_dump_json().encode())
    prior = await read_prior_output(js, names, response_id, since=queued)
    assert prior.token_ids == [0, 100, 1, 101, 2, 102, 3, 103]


async def test_groups_stored_before_the_request_was_queued_are_not_read(jetstream):
    js, names = jetstream
    response_id = new_response_id()
    group_subject = names.tokens_group_subject(bus.partition_of(response_id, names.token_partitions))
    stray = TokenBatch(response_id=response_id, attempt=0, batch_no=0, token_ids=[7])
    await js.publish(group_subject, TokenBatchGroup(batches=[GroupedBatch(batch=stray)]).model_dump_json().encode())
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5)
    assert (await read_prior_output(js, names, response_id, since=later)).token_ids == []
    assert (await read_prior_output(js, names, response_id)).token_ids == [7]
