"""The API's side of Postgres: record new responses and read them back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from schemas.events import LoggedEvent


@dataclass(frozen=True)
class NewResponse:
    response_id: str
    tenant_id: str
    model: str
    status: str
    background: bool
    store: bool
    previous_response_id: str | None
    request: dict[str, Any]
    parse_context: dict[str, Any]
    base_snapshot: dict[str, Any]
    input_items: list[dict[str, Any]]


@dataclass(frozen=True)
class StoredResponse:
    response_id: str
    status: str
    base_snapshot: dict[str, Any]
    snapshot: dict[str, Any] | None


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


class ResponseStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create(self, new: NewResponse, first_events: list[LoggedEvent]) -> None:
        """The response row, its input items and its first events, in one transaction."""
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO responses (id, tenant_id, model, status, background, store, previous_response_id,"
                " request, parse_context, base_snapshot)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9::jsonb, $10::jsonb)",
                new.response_id,
                new.tenant_id,
                new.model,
                new.status,
                new.background,
                new.store,
                new.previous_response_id,
                _json(new.request),
                _json(new.parse_context),
                _json(new.base_snapshot),
            )
            if new.input_items:
                await conn.executemany(
                    "INSERT INTO response_input_items (response_id, position, item_id, item) VALUES ($1, $2, $3, $4::jsonb)",
                    [(new.response_id, i, item["id"], _json(item)) for i, item in enumerate(new.input_items)],
                )
            await conn.executemany(
                "INSERT INTO response_events (response_id, seq, type, payload) VALUES ($1, $2, $3, $4)",
                [(new.response_id, e.seq, e.type, e.payload) for e in first_events],
            )

    async def fail_unstarted(self, response_id: str, events: list[LoggedEvent], snapshot: dict[str, Any]) -> None:
        """Ends a response no worker will ever see (its work could not be published)."""
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.executemany(
                "INSERT INTO response_events (response_id, seq, type, payload) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT DO NOTHING",
                [(response_id, e.seq, e.type, e.payload) for e in events],
            )
            await conn.execute(
                "UPDATE responses SET status = 'failed', snapshot = $2::jsonb, error = $3::jsonb,"
                " completed_at = now(), updated_at = now() WHERE id = $1",
                response_id,
                _json(snapshot),
                _json(snapshot.get("error")),
            )

    async def get(self, response_id: str, tenant_id: str) -> StoredResponse | None:
        row = await self._pool.fetchrow(
            "SELECT status, base_snapshot::text, snapshot::text FROM responses WHERE id = $1 AND tenant_id = $2",
            response_id,
            tenant_id,
        )
        if row is None:
            return None
        return StoredResponse(
            response_id, row[0], orjson.loads(row[1]), orjson.loads(row[2]) if row[2] is not None else None
        )
