"""Partitions of some work held through leases in a NATS KV bucket: one holder per partition.

create = claim, update by revision = renew, delete = release, bucket TTL = lease
expiry (an existing bucket made with another TTL is brought to this one's). Live
holders register in a second bucket; each aims at its fair share,
ceil(partitions / live holders): one holding more releases the surplus, one holding
less claims free partitions.

A holder that dies is noticed by NATS rather than by the TTL: every holder answers on a
presence subject of its own, and NATS drops that subscription with the dead process's
connection, after which a request to it is refused at once ("no responders"). Each
round the holders probe one another; one refused on two rounds in a row has its
holder key and leases deleted, and its partitions are claimed in the same round. A
holder that is merely slow (a loaded machine) keeps its subscription, so its probes
time out instead of being refused, and nothing is taken from it; one cut off from NATS
stops renewing, and its leases lapse with the TTL.

Parsers lease the token partitions (``scope`` empty); the workers of one model lease
that model's affinity shards (``scope`` the model's token), sharing two buckets with the
workers of every other model: keys are prefixed with the scope, and only the holders of
one's own scope count towards one's share."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
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
# How long a probe of a live holder may take to be answered; one slower than this is
# not evidence of anything.
PROBE_TIMEOUT_S = 0.25
# After this connection reconnects, the other holders may still be reconnecting (and
# unsubscribed): nobody is judged dead for this long.
RECONNECT_GRACE_S = 2 * LEASE_TTL_S

PartitionCallback = Callable[[int], Awaitable[None]]


class PartitionLeases:
    def __init__(self, nc: Client, *, leases_bucket: str, holders_bucket: str, partitions: int,
                 instance_id: str, presence_prefix: str, replicas: int = 1, scope: str = "") -> None:
        """``presence_prefix``: holders answer probes on ``<presence_prefix>.<instance_id>``."""
        self._nc = nc
        self._js = nc.jetstream()
        self._leases_bucket = leases_bucket
        self._holders_bucket = holders_bucket
        self._partitions = partitions
        self._instance_id = instance_id
        self._replicas = replicas
        self._prefix = f"{scope}." if scope else ""
        self._presence_prefix = presence_prefix
        self.presence = Presence(nc, f"{presence_prefix}.{instance_id}")
        self._revisions: dict[int, int] = {}
        # Holders refused on the latest round's probe, and those judged dead since (with
        # when, on the monotonic clock).
        self._unanswered: set[str] = set()
        self._evicted: dict[str, float] = {}
        self._reconnects = 0
        self._reconnected_at = -math.inf
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
        # Answering before registering: a holder listed is one that can be probed.
        await self.presence.start()
        try:
            while True:
                try:
                    await self._round(acquired, lost)
                except Exception:
                    log.exception("lease round failed")
                self._started = True
                await asyncio.sleep(RENEW_EVERY_S)
        finally:
            await self.presence.stop()
            await self._live.stop()

    def _key(self, partition: int) -> str:
        return f"{self._prefix}p{partition}"

    def _others(self) -> set[str]:
        """The instance ids of the other holders of this scope."""
        return ({key.removeprefix(self._prefix) for key, _ in self._live.items() if key.startswith(self._prefix)}
                - {self._instance_id})

    async def _live_holders(self) -> int:
        await self._holders.put(self._prefix + self._instance_id, b"1")
        others = self._others()
        # An evicted holder stays out of the count until the mirror has its key's delete;
        # one that writes its key again after that was alive after all (NATS lost its
        # presence for a moment) and counts again.
        now = time.monotonic()
        self._evicted = {instance: at for instance, at in self._evicted.items()
                         if instance in others and (self._live.age_s(self._prefix + instance) or 0.0) >= now - at}
        return len(others - self._evicted.keys()) + 1

    async def _evict_dead_holders(self) -> None:
        """Frees the partitions of holders whose presence NATS refused twice in a row."""
        loop = asyncio.get_running_loop()
        if self._nc.stats["reconnects"] != self._reconnects:
            self._reconnects = self._nc.stats["reconnects"]
            self._reconnected_at = loop.time()
        others = sorted(self._others() - self._evicted.keys())
        answered = await asyncio.gather(*(self._answers(instance) for instance in others))
        refused = {instance for instance, answer in zip(others, answered, strict=True) if not answer}
        dead, self._unanswered = refused & self._unanswered, refused
        if loop.time() - self._reconnected_at < RECONNECT_GRACE_S:
            return
        for instance in dead:
            log.warning("holder %s is gone from NATS; freeing its partitions", instance)
            self._evicted[instance] = time.monotonic()
            with suppress(KeyValueError):
                await self._holders.delete(self._prefix + instance)
            await asyncio.gather(*(self._free(partition, instance) for partition in range(self._partitions)
                                   if partition not in self._revisions))

    async def _answers(self, instance: str) -> bool:
        """False only when NATS says nobody listens on the holder's presence subject."""
        try:
            await self._nc.request(f"{self._presence_prefix}.{instance}", b"", timeout=PROBE_TIMEOUT_S)
        except NoRespondersError:
            return False
        except Exception:
            return True
        return True

    async def _free(self, partition: int, holder: str) -> None:
        """Deletes the partition's lease if ``holder`` has it; a newer claim stays."""
        with suppress(KeyValueError):
            entry = await self._leases.get(self._key(partition))
            if entry.value == holder.encode() and entry.revision is not None:
                await self._leases.delete(self._key(partition), last=entry.revision)

    async def _round(self, acquired: PartitionCallback, lost: PartitionCallback) -> None:
        # Renewals first, all at once: counting the holders takes round trips a renewal need
        # not wait for, and on a loaded bus renewals one after another can outlast the TTL.
        held = list(self._revisions.items())
        renewals = await asyncio.gather(*(self._renew(partition, revision) for partition, revision in held),
                                        return_exceptions=True)
        failure: BaseException | None = None
        for (partition, _), renewed in zip(held, renewals, strict=True):
            if isinstance(renewed, int):
                self._revisions[partition] = renewed
            elif renewed is None:
                del self._revisions[partition]
                log.warning("lost the lease on partition %s", self._key(partition))
                await lost(partition)
            else:  # not answered: still ours until the TTL says otherwise
                failure = failure or renewed
        if failure is not None:
            raise failure
        await self._evict_dead_holders()
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

    async def _renew(self, partition: int, revision: int) -> int | None:
        """The lease's new revision, or None when it is no longer this holder's."""
        try:
            return await self._leases.update(self._key(partition), self._instance_id.encode(), last=revision)
        except KeyValueError:
            return None

    async def release_all(self, lost: PartitionCallback) -> None:
        for partition, revision in list(self._revisions.items()):
            await lost(partition)
            with suppress(Exception):
                await self._leases.delete(self._key(partition), last=revision)
        self._revisions.clear()
        with suppress(Exception):
            await self._holders.delete(self._prefix + self._instance_id)


class Presence:
    """A holder's presence subject: it answers every probe, for as long as it is started."""

    def __init__(self, nc: Client, subject: str) -> None:
        self._nc = nc
        self._subject = subject
        self._subscription: Subscription | None = None

    async def start(self) -> None:
        self._subscription = await self._nc.subscribe(self._subject, cb=self._answer)
        await self._nc.flush()

    async def stop(self) -> None:
        if self._subscription is not None:
            with suppress(Exception):
                await self._subscription.unsubscribe()
            self._subscription = None

    async def _answer(self, msg: Msg) -> None:
        with suppress(Exception):
            await msg.respond(b"")
