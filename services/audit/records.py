"""What the audit reads from Postgres: a response as stored (row, events with their
hashes and times, the parser's record of its token stream, what its chain links to),
chains of responses, conversations. Reads never write; ``tenant_id`` None reads any
tenant's (the ``steno audit`` command, run by whoever holds the database)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
import orjson

from steno.schemas.fold import fold
from steno.services.parser import EventLog, ResponseRecord


@dataclass(frozen=True)
class StoredEvent:
    seq: int
    type: str
    payload: str
    hash: bytes | None
    stored_at: datetime


@dataclass(frozen=True)
class LinkTarget:
    """The event a response's first event chained to, as it is stored now."""

    response_stored: bool
    event_stored: bool
    hash: bytes | None
    conversation_id: str | None


@dataclass(frozen=True)
class StoredResponse:
    response_id: str
    tenant_id: str
    model: str
    status: str
    store: bool
    created_at: datetime
    previous_response_id: str | None
    conversation_id: str | None
    base_snapshot: dict[str, Any]
    snapshot: dict[str, Any] | None
    chained_to_response_id: str | None
    chained_to_seq: int | None
    chained_to_hash: bytes | None
    events: list[StoredEvent]
    # The parser's record (request context, token batches), for a re-parse.
    record: ResponseRecord
    link: LinkTarget | None = None

    @property
    def parse_context(self) -> dict[str, Any]:
        return self.record.parse_context


@dataclass(frozen=True)
class Turn:
    """One response of a chain or a conversation (``response_id`` None: items added to a
    conversation by themselves)."""

    response_id: str | None
    input: list[dict[str, Any]]
    output: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None
    status: str | None = None
    created_at: datetime | None = None
    instructions: Any = None
    previous_response_id: str | None = None


@dataclass(frozen=True)
class StoredConversation:
    conversation_id: str
    created_at: datetime
    metadata: dict[str, Any]
    turns: list[Turn]
    # Its responses, in the conversation's order.
    response_ids: list[str]


_RESPONSE = """
SELECT id, tenant_id, model, status, store, created_at, previous_response_id, conversation_id,
       base_snapshot::text, snapshot::text, chained_to_response_id, chained_to_seq, chained_to_hash
FROM responses WHERE id = $1 AND ($2::text IS NULL OR (tenant_id = $2 AND store))
"""
_EVENTS = "SELECT seq, type, payload, hash, created_at FROM response_log WHERE response_id = $1 ORDER BY seq"
_LINK = """
SELECT r.conversation_id, e.seq IS NOT NULL, e.hash
FROM responses AS r LEFT JOIN response_log AS e ON e.response_id = r.id AND e.seq = $2
WHERE r.id = $1
"""


class AuditRecords:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def response(self, response_id: str, tenant_id: str | None = None) -> StoredResponse | None:
        """Everything of one response from one snapshot of the database, so that a
        response still being written is read as of one commit."""
        async with self._pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            row = await conn.fetchrow(_RESPONSE, response_id, tenant_id)
            if row is None:
                return None
            record = await EventLog(conn).load(response_id)
            assert record is not None  # the row is there, in this snapshot
            events = [StoredEvent(*event) for event in await conn.fetch(_EVENTS, response_id)]
            link = None
            if row["chained_to_response_id"] is not None:
                target = await conn.fetchrow(_LINK, row["chained_to_response_id"], row["chained_to_seq"])
                link = LinkTarget(False, False, None, None) if target is None else \
                    LinkTarget(True, target[1], target[2], target[0])
        return StoredResponse(
            response_id=row["id"], tenant_id=row["tenant_id"], model=row["model"], status=row["status"],
            store=row["store"], created_at=row["created_at"], previous_response_id=row["previous_response_id"],
            conversation_id=row["conversation_id"], base_snapshot=orjson.loads(row["base_snapshot"]),
            snapshot=orjson.loads(row["snapshot"]) if row["snapshot"] is not None else None,
            chained_to_response_id=row["chained_to_response_id"], chained_to_seq=row["chained_to_seq"],
            chained_to_hash=row["chained_to_hash"], events=events, record=record, link=link,
        )

    async def events(self, response_id: str, tenant_id: str | None = None) -> list[StoredEvent] | None:
        """The response's stored events in order; None for no such response."""
        async with self._pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            if await conn.fetchrow(_RESPONSE, response_id, tenant_id) is None:
                return None
            return [StoredEvent(*event) for event in await conn.fetch(_EVENTS, response_id)]

    async def response_ids(self, since: datetime | None = None) -> list[str]:
        """Every stored response (made at or after ``since``), oldest first."""
        rows = await self._pool.fetch(
            "SELECT id FROM responses WHERE $1::timestamptz IS NULL OR created_at >= $1 ORDER BY created_at, id",
            since)
        return [row[0] for row in rows]

    async def chain(self, response_id: str, tenant_id: str | None = None) -> list[Turn] | None:
        """The response and those it continues through ``previous_response_id``, oldest
        first, each with its input items and output; None for no such response."""
        rows = await self._pool.fetch(_CHAIN, response_id, tenant_id)
        if not rows:
            return None
        inputs = await self._input_items([row[0] for row in rows])
        outputs = await self._outputs(rows)
        return [Turn(row[0], inputs.get(row[0], []), outputs[row[0]], row[1], row[2], row[3],
                     orjson.loads(row[4]).get("instructions"), row[6]) for row in rows]

    async def conversation(self, conversation_id: str, tenant_id: str | None = None) -> StoredConversation | None:
        """The conversation's items in order, as turns (contract of migration 0008: a
        ``response_output`` entry stands for its response's output once it has ended;
        deleted items are left out)."""
        head = await self._pool.fetchrow(
            "SELECT id, created_at, metadata::text FROM conversations"
            " WHERE id = $1 AND ($2::text IS NULL OR tenant_id = $2)", conversation_id, tenant_id)
        if head is None:
            return None
        entries = await self._pool.fetch(_ENTRIES, conversation_id)
        deleted = {row[0] for row in await self._pool.fetch(
            "SELECT item_id FROM conversation_deleted_items WHERE conversation_id = $1", conversation_id)}
        response_ids = list(dict.fromkeys(row["response_id"] for row in entries if row["response_id"] is not None))
        responses = {row[0]: row for row in await self._pool.fetch(_RESPONSES_OF, response_ids)}
        outputs = await self._outputs(list(responses.values()))
        turns: list[Turn] = []
        for entry in entries:
            kind, response_id = entry["kind"], entry["response_id"]
            if kind == "response_output":
                if response_id not in responses:
                    continue  # the response is gone (deleted, expired); its items with it
                current = _turn_for(turns, response_id, responses[response_id])
                current.output.extend(item for item in outputs[response_id] if item.get("id") not in deleted)
                continue
            if entry["item_id"] in deleted or entry["item"] is None:
                continue
            item = orjson.loads(entry["item"])
            if kind == "response_input" and response_id in responses:
                _turn_for(turns, response_id, responses[response_id]).input.append(item)
            elif turns and turns[-1].response_id is None:
                turns[-1].input.append(item)
            else:
                turns.append(Turn(None, [item]))
        return StoredConversation(head[0], head[1], orjson.loads(head[2]), turns, response_ids)

    async def _input_items(self, response_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        rows = await self._pool.fetch(
            "SELECT response_id, item::text FROM response_input_items WHERE response_id = ANY($1::text[])"
            " ORDER BY response_id, position", response_ids)
        items: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            items.setdefault(row[0], []).append(orjson.loads(row[1]))
        return items

    async def _outputs(self, rows: list[asyncpg.Record]) -> dict[str, list[dict[str, Any]]]:
        """Each response's output: its final snapshot's, or (still running) what its
        events have told so far."""
        outputs: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            if row[5] is not None:
                outputs[row[0]] = list(orjson.loads(row[5]).get("output", []))
                continue
            events = await self._pool.fetch("SELECT payload FROM response_log WHERE response_id = $1 ORDER BY seq",
                                            row[0])
            folded = fold(orjson.loads(event[0]) for event in events)
            outputs[row[0]] = list((folded or {}).get("output", []))
        return outputs


def _turn_for(turns: list[Turn], response_id: str, row: asyncpg.Record) -> Turn:
    for turn in reversed(turns):
        if turn.response_id == response_id:
            return turn
    turn = Turn(response_id, [], [], row[1], row[2], row[3], orjson.loads(row[4]).get("instructions"), row[6])
    turns.append(turn)
    return turn


# Columns of a turn: id, model, status, created_at, base_snapshot, snapshot, previous_response_id.
_CHAIN = """
WITH RECURSIVE chain(id, previous, depth) AS (
    SELECT id, previous_response_id, 0 FROM responses
    WHERE id = $1 AND ($2::text IS NULL OR (tenant_id = $2 AND store))
    UNION ALL
    SELECT r.id, r.previous_response_id, c.depth + 1 FROM responses AS r JOIN chain AS c ON r.id = c.previous
    WHERE ($2::text IS NULL OR (r.tenant_id = $2 AND r.store)) AND c.depth < 10000
)
SELECT r.id, r.model, r.status, r.created_at, r.base_snapshot::text, r.snapshot::text, r.previous_response_id
FROM chain AS c JOIN responses AS r ON r.id = c.id ORDER BY c.depth DESC
"""
_RESPONSES_OF = """
SELECT id, model, status, created_at, base_snapshot::text, snapshot::text, previous_response_id
FROM responses WHERE id = ANY($1::text[])
"""
_ENTRIES = """
SELECT position, kind, response_id, item_id, item::text AS item FROM conversation_entries
WHERE conversation_id = $1 ORDER BY position
"""
