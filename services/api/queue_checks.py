"""Responses stored whose work never reached the queue.

An API process stores a response, then publishes its work; one that stops in between
(killed, its host lost) leaves a response ``queued`` that no worker will ever see: a
background response that never ends, a conversation kept busy by its turn for good.
Every API process looks every ``CHECK_EVERY_S`` for responses still ``queued`` between
``CHECK_AFTER_S`` and ``CHECK_UNTIL_S`` after they were stored, and publishes for each,
once, a ``QueueCheck`` whose message id is the response id, as its work's is. JetStream
drops the check as a duplicate where the work was queued (waiting for a worker,
generating, or done); it keeps it where the work never came, and a worker then ends
that response with an error.

``CHECK_AFTER_S`` is well past the longest an API process that lives takes from the
store to the publish's acknowledgement (the request store's write, then the PubAck's
timeout). ``CHECK_UNTIL_S`` is within JetStream's duplicate window, which is what tells
the two cases apart: a response whose API stopped, with no API process running again
within that window, stays queued.

Each round also marks this process's origin seen and deletes the origins unseen for
``ORIGIN_FORGOTTEN_AFTER_S``, so the table holds the processes that may still have
responses within the checks' reach, not a row for every process ever started."""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg

from steno.schemas.bus import QueueCheck
from steno.schemas.ids import ORIGIN_CHARS
from steno.services.common.bus import WORK_DUPLICATE_WINDOW_S, Names
from steno.services.common.stored_publish import StoredPublisher
from steno.services.common.tracing import message_headers

log = logging.getLogger(__name__)

CHECK_EVERY_S = 5.0
CHECK_AFTER_S = 20.0
# Leaves the check half a minute of the duplicate window for clocks and a slow sweep.
CHECK_UNTIL_S = WORK_DUPLICATE_WINDOW_S - 30.0
# Checks published at once.
PUBLISHES_AT_ONCE = 64

# An origin unseen this long made nothing the checks still look at (CHECK_UNTIL_S back),
# with an hour to spare for a process whose rounds stalled: its row goes. A process that
# comes back marks it again at its next round, well before its responses are checked.
ORIGIN_FORGOTTEN_AFTER_S = CHECK_UNTIL_S + 3600.0

_MARK_ORIGIN_SEEN = """
INSERT INTO api_origins (origin, namespace) VALUES ($1, $2)
ON CONFLICT (origin) DO UPDATE SET seen_at = now()
"""
_FORGET_ORIGINS = "DELETE FROM api_origins WHERE seen_at < now() - make_interval(secs => $1)"
# Through the index of running responses (migration 0011); only those of this
# namespace's API processes (migrations 0013, 0014).
_QUEUED_A_WHILE = """
SELECT r.id, r.model FROM responses AS r
JOIN api_origins AS o ON o.origin = substr(r.id, 6, $3)
WHERE r.status = 'queued' AND o.namespace = $4
  AND r.created_at <= now() - make_interval(secs => $1) AND r.created_at > now() - make_interval(secs => $2)
"""


class QueueChecks:
    def __init__(self, pool: asyncpg.Pool, publisher: StoredPublisher, names: Names, origin: str) -> None:
        self._pool = pool
        self._publisher = publisher
        self._names = names
        self._origin = origin
        # Response id -> when this process checked it (monotonic): each is checked once.
        self._checked: dict[str, float] = {}

    async def run(self) -> None:
        """A round every ``CHECK_EVERY_S`` until cancelled, the first at once: a process
        started after another stopped finds what that one left."""
        while True:
            try:
                await self.round()
            except Exception as exc:
                log.warning("checking queued responses failed (%s); trying again in %.0f s", exc, CHECK_EVERY_S)
            await asyncio.sleep(CHECK_EVERY_S)

    async def round(self) -> int:
        """Marks this process's origin seen (its responses are then ones its namespace's
        processes check, whenever they were made), forgets the origins of processes long
        gone, and checks; returns how many checks it published."""
        async with self._pool.acquire() as conn:
            await conn.execute(_MARK_ORIGIN_SEEN, self._origin, self._names.namespace)
            await conn.execute(_FORGET_ORIGINS, ORIGIN_FORGOTTEN_AFTER_S)
        return await self.check_once()

    async def check_once(self) -> int:
        """Publishes a check for each response queued a while that this process has not
        checked yet; returns how many."""
        now = time.monotonic()
        self._checked = {rid: at for rid, at in self._checked.items() if now - at < CHECK_UNTIL_S}
        due = [(rid, model) for rid, model in await self._pool.fetch(_QUEUED_A_WHILE, CHECK_AFTER_S, CHECK_UNTIL_S,
                                                                   ORIGIN_CHARS, self._names.namespace)
               if rid not in self._checked]
        for start in range(0, len(due), PUBLISHES_AT_ONCE):
            await asyncio.gather(*(self._check(rid, model) for rid, model in due[start:start + PUBLISHES_AT_ONCE]))
            self._checked.update((rid, now) for rid, _ in due[start:start + PUBLISHES_AT_ONCE])
        return len(due)

    async def _check(self, response_id: str, model: str) -> None:
        check = QueueCheck(response_id=response_id, model=model)
        await self._publisher.publish(self._names.gen_subject(model), check.model_dump_json().encode(),
                                      message_headers(response_id))
