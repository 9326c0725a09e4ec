"""Reads a response's stored events from Postgres (``response_log``: rows and compacted chunks alike)."""

from __future__ import annotations

import asyncpg

from steno.schemas.events import TERMINAL_EVENT_TYPES, LoggedEvent


class EventReader:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def read_after(self, response_id: str, after: int) -> list[LoggedEvent]:
        rows = await self._pool.fetch(
            "SELECT seq, type, payload FROM response_log WHERE response_id = $1 AND seq > $2 ORDER BY seq",
            response_id,
            after,
        )
        return [LoggedEvent(seq=r[0], type=r[1], payload=r[2]) for r in rows]

    async def ended_by(self, response_id: str, cursor: int) -> bool:
        """Whether the response's log ended at or before ``cursor``."""
        ended: bool = await self._pool.fetchval(
            "SELECT EXISTS (SELECT 1 FROM response_log WHERE response_id = $1 AND seq <= $2"
            " AND type = ANY($3::text[]))", response_id, cursor, list(TERMINAL_EVENT_TYPES))
        return ended
