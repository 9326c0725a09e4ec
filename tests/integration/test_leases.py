"""Partitions shared out through KV leases, against a real JetStream: fair shares within
a scope, scopes apart, a holder that leaves handing its partitions on, one that dies
having them taken over as soon as NATS drops its connection, one that is merely slow
keeping them (as does one whose every renewal is slow), one judged gone while alive
getting its share back, and buckets of an earlier release brought to the lease TTL."""

import asyncio
import secrets
import time
from collections.abc import Callable
from contextlib import suppress

import nats
import pytest
from nats.js.api import KeyValueConfig

from steno.services.common import leases
from steno.services.common.leases import LEASE_TTL_S, PartitionLeases

pytestmark = pytest.mark.integration

PARTITIONS = 8


class Holder:
    def __init__(self, nc, buckets: tuple[str, str], name: str, scope: str) -> None:
        self.held: set[int] = set()
        # Every partition it stopped holding, in order.
        self.losses: list[int] = []
        self.leases = PartitionLeases(nc, leases_bucket=buckets[0], holders_bucket=buckets[1], partitions=PARTITIONS,
                                      instance_id=name, presence_prefix=f"{buckets[1]}.presence", scope=scope)
        self.task = asyncio.create_task(self.leases.run(self._acquired, self._lost))

    async def _acquired(self, partition: int) -> None:
        self.held.add(partition)

    async def _lost(self, partition: int) -> None:
        self.held.discard(partition)
        self.losses.append(partition)

    async def leave(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.leases.release_all(self._lost)


async def settled(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the leases did not settle"
        await asyncio.sleep(0.2)


@pytest.fixture
async def jetstream(settings):
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    run = secrets.token_hex(3)
    buckets = (f"{settings.namespace}_leases_{run}", f"{settings.namespace}_holders_{run}")
    yield nc, buckets
    for bucket in buckets:
        with suppress(Exception):
            await js.delete_key_value(bucket)
    await nc.close()


async def test_holders_of_a_scope_share_its_partitions_fairly_and_apart_from_another_scope(jetstream):
    nc, buckets = jetstream
    first, second = Holder(nc, buckets, "first", "model-a"), Holder(nc, buckets, "second", "model-a")
    alone = Holder(nc, buckets, "alone", "model-b")
    try:
        await settled(lambda: len(first.held) == len(second.held) == PARTITIONS // 2)
        assert first.held | second.held == set(range(PARTITIONS))
        # The other scope's holders neither share its partitions nor shrink its share.
        await settled(lambda: alone.held == set(range(PARTITIONS)))

        await first.leave()
        assert first.held == set()
        await settled(lambda: second.held == set(range(PARTITIONS)))
    finally:
        for holder in (first, second, alone):
            await holder.leave()


async def test_a_holder_that_dies_has_its_partitions_taken_over_before_its_leases_lapse(
        jetstream, settings, monkeypatch):
    nc, buckets = jetstream
    # Leases that would outlive the test: a takeover can only come from NATS noticing.
    monkeypatch.setattr(leases, "LEASE_TTL_S", 120.0)
    own_connection = await nats.connect(settings.nats_url)
    first, second = Holder(own_connection, buckets, "first", "model-a"), Holder(nc, buckets, "second", "model-a")
    try:
        await settled(lambda: len(first.held) == len(second.held) == PARTITIONS // 2)
        # Dies as after SIGKILL: the connection goes, nothing is released.
        await own_connection.close()
        first.task.cancel()
        await asyncio.gather(first.task, return_exceptions=True)
        await settled(lambda: second.held == set(range(PARTITIONS)), timeout_s=20)
    finally:
        await second.leave()


@pytest.fixture
async def halves_held_for_good(jetstream, monkeypatch):
    """Two holders of model-a's partitions, half each, with leases that outlive the test:
    only presence can move a partition."""
    nc, buckets = jetstream
    monkeypatch.setattr(leases, "LEASE_TTL_S", 120.0)
    first, second = Holder(nc, buckets, "first", "model-a"), Holder(nc, buckets, "second", "model-a")
    try:
        await settled(lambda: len(first.held) == len(second.held) == PARTITIONS // 2)
        yield first, second
    finally:
        await first.leave()
        await second.leave()


async def test_a_holder_too_slow_to_renew_keeps_its_partitions_while_its_connection_lives(jetstream,
                                                                                          halves_held_for_good):
    nc, buckets = jetstream
    first, second = halves_held_for_good
    held_by_first = set(first.held)
    stalled = asyncio.Event()

    async def stall(*_: object) -> None:
        stalled.set()
        await asyncio.Event().wait()

    first.leases._round = stall  # its rounds stop; its presence still answers
    await stalled.wait()
    # The other holder probes it every round, many rounds over.
    await asyncio.sleep(20 * leases.RENEW_EVERY_S)
    assert second.held == set(range(PARTITIONS)) - held_by_first
    lease_bucket = await nc.jetstream().key_value(buckets[0])
    assert {(await lease_bucket.get(f"model-a.p{p}")).value for p in held_by_first} == {b"first"}


async def test_a_holder_whose_every_renewal_is_slow_keeps_its_partitions(jetstream):
    """On a loaded bus each renewal takes a while: renewed one after another, the last
    would come after its lease lapsed."""
    nc, buckets = jetstream
    holder = Holder(nc, buckets, "only", "model-a")
    try:
        await settled(lambda: holder.held == set(range(PARTITIONS)))
        lease_bucket = holder.leases._leases
        update = lease_bucket.update

        async def slow_update(*args, **kwargs):
            await asyncio.sleep(LEASE_TTL_S / 5)
            return await update(*args, **kwargs)

        lease_bucket.update = slow_update
        await asyncio.sleep(3 * LEASE_TTL_S)
        assert holder.losses == []
        assert holder.held == set(range(PARTITIONS))
    finally:
        await holder.leave()


async def test_a_live_holder_whose_presence_was_lost_for_a_while_gets_its_share_back(halves_held_for_good):
    first, second = halves_held_for_good
    # NATS refuses probes of the first holder, whose rounds go on: it is judged gone.
    await first.leases.presence.stop()
    await settled(lambda: second.held == set(range(PARTITIONS)) and not first.held)
    await first.leases.presence.start()
    # It keeps registering, so it counts again and the partitions are shared again.
    await settled(lambda: len(first.held) == len(second.held) == PARTITIONS // 2)


async def test_buckets_made_with_another_ttl_take_the_lease_ttl(jetstream):
    nc, buckets = jetstream
    js = nc.jetstream()
    for bucket in buckets:  # as an earlier release made them
        await js.create_key_value(KeyValueConfig(bucket=bucket, ttl=3 * LEASE_TTL_S, history=1))
    holder = Holder(nc, buckets, "only", "model-a")
    try:
        await settled(lambda: holder.held == set(range(PARTITIONS)))
        assert [(await (await js.key_value(bucket)).status()).ttl for bucket in buckets] == [LEASE_TTL_S] * 2
    finally:
        await holder.leave()
