"""Deleting what has expired, a batch at a time (what expires when: migration 0010), and
compacting the events of responses that have ended (migration 0012).

Every API replica sweeps; each batch is one short transaction over rows found through
the expiry indexes, skipping rows another replica holds, with a pause between batches,
so that a large backlog never holds locks or the pool for long while streams are served.
Conversations go first: their responses then fall to their own retention (the database
sets it as the conversation goes) and are swept with the rest. Then the events of
responses ended more than ``COMPACT_AFTER_S`` ago go from a row each to one chunk row.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import asyncpg

from steno.services.api.store import ResponseStore

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 30.0
BATCH = 500
# Between batches: the streams' queries get the pool and the disk in the meantime.
PAUSE_S = 0.05
# Responses whose events one compaction transaction moves (each up to thousands of rows).
COMPACT_BATCH = 50
# A response's events stay a row each this long after it ends: its live tails have read
# them by then, and no late write can still come (a parser that lost its lease writes
# within its ack wait; docs/architecture.md, Determinism).
COMPACT_AFTER_S = 60.0

_EXPIRED_CONVERSATIONS = """
DELETE FROM conversations WHERE id IN (
    SELECT id FROM conversations WHERE expires_at < now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)
"""


@dataclass
class Swept:
    conversations: int = 0
    responses: int = 0
    compacted: int = 0


class RetentionSweeper:
    def __init__(self, pool: asyncpg.Pool, store: ResponseStore, batch: int = BATCH, pause_s: float = PAUSE_S,
                 compact_after_s: float = COMPACT_AFTER_S) -> None:
        self._pool = pool
        self._store = store
        self._batch = batch
        self._pause_s = pause_s
        self._compact_after_s = compact_after_s

    async def sweep(self) -> Swept:
        """Deletes everything expired by now, then compacts what has ended, batch by batch."""
        swept = Swept()
        while True:
            status = await self._pool.execute(_EXPIRED_CONVERSATIONS, self._batch)
            deleted = int(status.split()[-1])
            swept.conversations += deleted
            if deleted < self._batch:
                break
            await asyncio.sleep(self._pause_s)
        while True:
            deleted = await self._store.purge_expired(self._batch)
            swept.responses += deleted
            if deleted < self._batch:
                break
            await asyncio.sleep(self._pause_s)
        while True:
            compacted = await self._store.compact_ended(COMPACT_BATCH, self._compact_after_s)
            swept.compacted += compacted
            if compacted < COMPACT_BATCH:
                break
            await asyncio.sleep(self._pause_s)
        return swept

    async def run(self, every_s: float = SWEEP_EVERY_S) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                swept = await self.sweep()
            except Exception:
                log.warning("sweeping expired data failed; trying again in %.0f s", every_s, exc_info=True)
                continue
            if swept.conversations or swept.responses:
                log.info("swept %d expired conversations and %d expired responses", swept.conversations,
                         swept.responses)
            if swept.compacted:
                log.debug("compacted the events of %d ended responses", swept.compacted)


DEFAULT_POLICY = "*"


async def set_policy(pool: asyncpg.Pool, tenant: str, days: int) -> None:
    """How long ``tenant``'s (DEFAULT_POLICY: every tenant's) responses and conversations
    stored from now on are kept."""
    await pool.execute("INSERT INTO retention_policies (tenant_id, days) VALUES ($1, $2) "
                       "ON CONFLICT (tenant_id) DO UPDATE SET days = excluded.days", tenant, days)


async def clear_policy(pool: asyncpg.Pool, tenant: str) -> bool:
    return await pool.execute("DELETE FROM retention_policies WHERE tenant_id = $1", tenant) != "DELETE 0"


async def list_policies(pool: asyncpg.Pool) -> list[tuple[str, int]]:
    return [(row[0], row[1]) for row in await pool.fetch("SELECT tenant_id, days FROM retention_policies ORDER BY 1")]
