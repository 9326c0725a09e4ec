"""Partitions of some work held through leases in a NATS KV bucket: one holder per partition.

create = claim, update by revision = renew, delete = release, bucket TTL = lease
expiry (an existing bucket made with another TTL is brought to this one's). Live
holders register in a second bucket; each aims at its fair share,
ceil(partitions / live holders): one holding more releases the surplus, one holding
less claims free partitions. A holder that dies stops renewing and its partitions are
free within the TTL.

Parsers lease the token partitions (``scope`` empty); the workers of one model lease
that model's affinity shards (``scope`` the model's token), sharing two buckets with the
workers of every other model: keys are prefixed with the scope, and only the holders of
one's own scope count towards one's share."""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable
from contextlib import suppress

from nats.js import JetStreamContext
from nats.js.errors import KeyValueError

from steno.services.common.bus import kv_bucket
from steno.services.common.kv_mirror import KvMirror
from steno.services.common.metrics import PARTITIONS_TAKEN_OVER

log = logging.getLogger(__name__)

# A dead holder's partitions are free this long after its last renewal; a live one
# renews four times within it, so a loaded machine delaying a round or two takes
# nothing from it.
LEASE_TTL_S = 2.0
RENEW_EVERY_S = 0.5

PartitionCallback = Callable[[int], Awaitable[None]]


class PartitionLeases:
    def __init__(self, js: JetStreamContext, *, leases_bucket: str, holders_bucket: str, partitions: int,
                 instance_id: str, replicas: int = 1, scope: str = "") -> None:
        self._js = js
        self._leases_bucket = leases_bucket
        self._holders_bucket = holders_bucket
        self._partitions = partitions
        self._instance_id = instance_id
        self._replicas = replicas
        self._prefix = f"{scope}." if scope else ""
        self._revisions: dict[int, int] = {}
        # What its first round claims is a start; what later rounds claim was another holder's.
        self._started = False
        self._taken_over = PARTITIONS_TAKEN_OVER.labels("worker" if scope else "parser")

    async def run(self, acquired: PartitionCallback, lost: PartitionCallback) -> None:
        self._leases = await kv_bucket(self._js, self._leases_bucket, LEASE_TTL_S, self._replicas)
        self._holders = await kv_bucket(self._js, self._holders_bucket, LEASE_TTL_S, self._replicas)
        # The holders are followed by one watcher: listing the bucket's keys every round
        # would make (and leave lingering) a JetStream consumer each time.
        self._live = KvMirror(self._holders, self._holders_bucket, LEASE_TTL_S)
        await self._live.start()
        try:
            while True:
                try:
                    await self._round(acquired, lost)
                except Exception:
                    log.exception("lease round failed")
                self._started = True
                await asyncio.sleep(RENEW_EVERY_S)
        finally:
            await self._live.stop()

    def _key(self, partition: int) -> str:
        return f"{self._prefix}p{partition}"

    async def _live_holders(self) -> int:
        own = self._prefix + self._instance_id
        await self._holders.put(own, b"1")
        return len({key for key, _ in self._live.items() if key.startswith(self._prefix)} | {own})

    async def _round(self, acquired: PartitionCallback, lost: PartitionCallback) -> None:
        # Renewals first: counting the holders takes round trips a renewal need not wait for.
        for partition, revision in list(self._revisions.items()):
            try:
                self._revisions[partition] = await self._leases.update(
                    self._key(partition), self._instance_id.encode(), last=revision
                )
            except KeyValueError:
                del self._revisions[partition]
                log.warning("lost the lease on partition %s", self._key(partition))
                await lost(partition)
        share = math.ceil(self._partitions / await self._live_holders())
        while len(self._revisions) > share:
            partition = max(self._revisions)
            await lost(partition)
            revision = self._revisions.pop(partition)
            with suppress(KeyValueError):
                await self._leases.delete(self._key(partition), last=revision)
            log.info("released partition %s (share %d)", self._key(partition), share)
        if len(self._revisions) >= share:
            return
        candidates = [p for p in range(self._partitions) if p not in self._revisions]
        random.shuffle(candidates)
        for partition in candidates:
            if len(self._revisions) >= share:
                break
            try:
                self._revisions[partition] = await self._leases.create(self._key(partition),
                                                                       self._instance_id.encode())
            except KeyValueError:
                continue
            log.info("acquired partition %s", self._key(partition))
            if self._started:
                self._taken_over.inc()
            await acquired(partition)

    async def release_all(self, lost: PartitionCallback) -> None:
        for partition, revision in list(self._revisions.items()):
            await lost(partition)
            with suppress(Exception):
                await self._leases.delete(self._key(partition), last=revision)
        self._revisions.clear()
        with suppress(Exception):
            await self._holders.delete(self._prefix + self._instance_id)
