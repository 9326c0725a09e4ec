"""The worker's token batches grouped per partition (``BatchGroups``), against real
JetStream: what is published in one turn of the event loop is stored as one message per
partition, a batch without company goes on its own subject, and a group that cannot be
stored fails every batch in it, or sends each again alone where the worker says how."""

import asyncio

import pytest
from nats.js.errors import NoStreamResponseError

from steno.schemas.bus import TokenBatch, TokenBatchGroup, token_partition_message
from steno.services.common import bus
from steno.services.common.stored_publish import StoredPublisher
from steno.services.worker.batch_groups import BatchGroups, Carried
from tests.conftest import namespace_of_its_own
from tests.token_streams import neighbours

pytestmark = pytest.mark.integration


@pytest.fixture
async def bus_of_test(settings):
    async with namespace_of_its_own(settings, "groups") as (names, nc):
        publisher = StoredPublisher(nc)
        await publisher.start()
        yield nc.jetstream(), names, publisher, bus.message_limit(nc)
        await publisher.stop()


def encoded(rid: str, number: int, padding: int = 0) -> tuple[str, bytes, str, Carried]:
    batch = TokenBatch(response_id=rid, attempt=0, batch_no=number, token_ids=[number] * (1 + padding))
    return rid, batch.model_dump_json().encode(), f"{rid}:0:{number}", Carried.of({"Steno-Tenant": "a"})


async def stored_on(js, names, subject: str) -> list[bytes]:
    info = await js.stream_info(names.tokens_stream, subjects_filter=subject)
    count = (info.state.subjects or {}).get(subject, 0)
    subscription = await js.pull_subscribe(subject, stream=names.tokens_stream)
    try:
        return [msg.data for msg in (await subscription.fetch(count, timeout=2))] if count else []
    finally:
        await subscription.unsubscribe()


async def test_batches_of_one_partition_published_together_are_one_message(bus_of_test, settings):
    js, names, publisher, limit = bus_of_test
    groups = BatchGroups(publisher, names, limit)
    ids = neighbours(settings, 3)
    await asyncio.gather(*(groups.publish(*encoded(rid, 0)) for rid in ids))
    partition = bus.partition_of(ids[0], settings.token_partitions)
    [stored] = await stored_on(js, names, names.tokens_group_subject(partition))
    group = token_partition_message.validate_json(stored)
    assert isinstance(group, TokenBatchGroup)
    assert [grouped.batch.response_id for grouped in group.batches] == ids  # in the order published
    assert all(grouped.headers == {"Steno-Tenant": "a"} for grouped in group.batches)
    for rid in ids:
        assert await stored_on(js, names, names.tokens_subject(rid)) == []


async def test_a_batch_without_company_goes_on_its_own_subject(bus_of_test, settings):
    js, names, publisher, limit = bus_of_test
    groups = BatchGroups(publisher, names, limit)
    [alone] = neighbours(settings, 1)
    rid, body, msg_id, carried = encoded(alone, 0)
    await groups.publish(rid, body, msg_id, carried)
    assert await stored_on(js, names, names.tokens_subject(alone)) == [body]
    partition = bus.partition_of(alone, settings.token_partitions)
    assert await stored_on(js, names, names.tokens_group_subject(partition)) == []


async def test_a_group_stays_under_the_message_limit(bus_of_test, settings):
    js, names, publisher, _ = bus_of_test
    batches = [encoded(rid, 0, padding=200) for rid in neighbours(settings, 6)]
    limit = 3 * (len(batches[0][1]) + 300)  # about three batches a message
    groups = BatchGroups(publisher, names, limit)
    await asyncio.gather(*(groups.publish(*batch) for batch in batches))
    partition = bus.partition_of(batches[0][0], settings.token_partitions)
    stored = await stored_on(js, names, names.tokens_group_subject(partition))
    assert len(stored) >= 2 and all(len(message) <= limit for message in stored)
    carried = [grouped.batch.response_id for message in stored
               for grouped in TokenBatchGroup.model_validate_json(message).batches]
    assert carried == [batch[0] for batch in batches]


async def test_a_group_that_is_not_stored_fails_every_batch_in_it(bus_of_test, settings):
    _, _, publisher, limit = bus_of_test
    nowhere = bus.Names(settings.namespace + "nostream", settings.token_partitions)
    groups = BatchGroups(publisher, nowhere, limit)
    outcomes = await asyncio.gather(*(groups.publish(*encoded(rid, 0)) for rid in neighbours(settings, 3)),
                                    return_exceptions=True)
    assert all(isinstance(outcome, NoStreamResponseError) for outcome in outcomes)



async def test_each_batch_of_a_group_not_stored_goes_again_alone(bus_of_test, settings):
    _, _, publisher, limit = bus_of_test
    nowhere = bus.Names(settings.namespace + "nostream", settings.token_partitions)
    sent_alone: list[tuple[str, bytes, str, dict[str, str]]] = []

    async def alone(subject: str, body: bytes, msg_id: str, headers: dict[str, str]) -> None:
        sent_alone.append((subject, body, msg_id, headers))

    groups = BatchGroups(publisher, nowhere, limit, alone=alone)
    batches = [encoded(rid, 0) for rid in neighbours(settings, 3)]
    await asyncio.gather(*(groups.publish(*batch) for batch in batches))
    assert sent_alone == [(nowhere.tokens_subject(rid), body, msg_id, carried.headers)
                          for rid, body, msg_id, carried in batches]
