"""Token partitions held through leases in a NATS KV bucket: one parser per partition.

create = claim, update by revision = renew, delete = release, bucket TTL = lease
expiry. Live parsers register in a second bucket; each aims at its fair share,
ceil(partitions / live parsers): one holding more releases the surplus, one holding
less claims free partitions. A parser that dies stops renewing and its partitions are
free within the TTL. Losing a lease stops that partition's consumption at once; and
since events are a pure function of the batches, a writer that has not yet noticed
it lost a lease can only write rows identical to those of the new holder."""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable
from contextlib import suppress

from nats.js import JetStreamContext
from nats.js.errors import KeyValueError, NoKeysError

from steno.services.common.bus import Names, kv_bucket

log = logging.getLogger(__name__)

LEASE_TTL_S = 6.0
RENEW_EVERY_S = 2.0

PartitionCallback = Callable[[int], Awaitable[None]]


class PartitionLeases:
    def __init__(self, js: JetStreamContext, names: Names, instance_id: str) -> None:
        self._js = js
        self._names = names
        self._instance_id = instance_id
        self._revisions: dict[int, int] = {}

    async def run(self, acquired: PartitionCallback, lost: PartitionCallback) -> None:
        self._leases = await kv_bucket(self._js, self._names.parser_leases_bucket, LEASE_TTL_S, self._names.replicas)
        self._members = await kv_bucket(self._js, self._names.parsers_bucket, LEASE_TTL_S, self._names.replicas)
        while True:
            try:
                await self._round(acquired, lost)
            except Exception:
                log.exception("lease round failed")
            await asyncio.sleep(RENEW_EVERY_S)

    async def _live_parsers(self) -> int:
        await self._members.put(self._instance_id, b"1")
        try:
            return max(1, len(await self._members.keys()))
        except NoKeysError:
            return 1

    async def _round(self, acquired: PartitionCallback, lost: PartitionCallback) -> None:
        partitions = self._names.token_partitions
        share = math.ceil(partitions / await self._live_parsers())
        for partition, revision in list(self._revisions.items()):
            try:
                self._revisions[partition] = await self._leases.update(
                    f"p{partition}", self._instance_id.encode(), last=revision
                )
            except KeyValueError:
                del self._revisions[partition]
                log.warning("lost the lease on partition %d", partition)
                await lost(partition)
        while len(self._revisions) > share:
            partition = max(self._revisions)
            await lost(partition)
            revision = self._revisions.pop(partition)
            with suppress(KeyValueError):
                await self._leases.delete(f"p{partition}", last=revision)
            log.info("released partition %d (share %d)", partition, share)
        if len(self._revisions) >= share:
            return
        candidates = [p for p in range(partitions) if p not in self._revisions]
        random.shuffle(candidates)
        for partition in candidates:
            if len(self._revisions) >= share:
                break
            try:
                self._revisions[partition] = await self._leases.create(f"p{partition}", self._instance_id.encode())
            except KeyValueError:
                continue
            log.info("acquired partition %d", partition)
            await acquired(partition)

    async def release_all(self, lost: PartitionCallback) -> None:
        for partition, revision in list(self._revisions.items()):
            await lost(partition)
            with suppress(Exception):
                await self._leases.delete(f"p{partition}", last=revision)
        self._revisions.clear()
        with suppress(Exception):
            await self._members.delete(self._instance_id)
