"""The conversations' side of Postgres (migration 0008): conversations, their entries
and deleted items, always within the caller's tenant.

A conversation's items are its entries in position order, a ``response_output`` entry
standing for its response's output items once the response has ended (read from the
response's final snapshot), and every item whose id is in ``conversation_deleted_items``
left out. Whatever appends takes the conversation's row lock first, so positions are
handed out one writer at a time and a response's check that none is running in the
conversation holds until its own entries are in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg
import orjson
from asyncpg.pool import PoolConnectionProxy

from steno.services.api.store import TERMINAL_STATUSES, output_items
from steno.services.common.db import unnest_columns

_TERMINAL = sorted(TERMINAL_STATUSES)
if TYPE_CHECKING:
    # A connection taken from the pool (inside a transaction).
    Connection = PoolConnectionProxy[asyncpg.Record]


@dataclass(frozen=True)
class StoredConversation:
    conversation_id: str
    created_at: int
    metadata: dict[str, str]

    def as_object(self) -> dict[str, Any]:
        """The SDK's ``Conversation``."""
        return {"id": self.conversation_id, "object": "conversation", "created_at": self.created_at,
                "metadata": self.metadata}


@dataclass(frozen=True)
class ItemsPage:
    items: list[dict[str, Any]]
    has_more: bool


class ConversationMissing(Exception):
    """No such conversation for this tenant (or it was deleted meanwhile)."""


class ConversationBusy(Exception):
    """A response of the conversation has not ended yet."""

    def __init__(self, response_id: str) -> None:
        super().__init__(response_id)
        self.response_id = response_id


class ItemsAlreadyInConversation(Exception):
    """Ids that are, or were, items of the conversation."""

    def __init__(self, item_ids: list[str]) -> None:
        super().__init__(", ".join(item_ids))
        self.item_ids = item_ids


def _conversation(row: asyncpg.Record) -> StoredConversation:
    return StoredConversation(row["id"], int(row["created_at"].timestamp()), orjson.loads(row["metadata"]))


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


class ConversationStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create(self, conversation_id: str, tenant_id: str, metadata: dict[str, str],
                     items: list[dict[str, Any]]) -> StoredConversation:
        """The conversation with its first items, atomically."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "INSERT INTO conversations (id, tenant_id, metadata) VALUES ($1, $2, $3::json)"
                " RETURNING id, created_at, metadata::text",
                conversation_id, tenant_id, _json(metadata),
            )
            await _insert_items(conn, conversation_id, 0, "item", None, items)
        assert row is not None  # an INSERT ... RETURNING returns its row
        return _conversation(row)

    async def get(self, conversation_id: str, tenant_id: str) -> StoredConversation | None:
        row = await self._pool.fetchrow(
            "SELECT id, created_at, metadata::text FROM conversations WHERE id = $1 AND tenant_id = $2",
            conversation_id, tenant_id,
        )
        return None if row is None else _conversation(row)

    async def update_metadata(self, conversation_id: str, tenant_id: str,
                              metadata: dict[str, str]) -> StoredConversation | None:
        row = await self._pool.fetchrow(
            "UPDATE conversations SET metadata = $3::json WHERE id = $1 AND tenant_id = $2"
            " RETURNING id, created_at, metadata::text",
            conversation_id, tenant_id, _json(metadata),
        )
        return None if row is None else _conversation(row)

    async def delete(self, conversation_id: str, tenant_id: str) -> bool:
        """The conversation with its entries; its responses stay, as responses of their own."""
        return bool(await self._pool.fetchval(
            "DELETE FROM conversations WHERE id = $1 AND tenant_id = $2 RETURNING true", conversation_id, tenant_id))

    async def append_items(self, conversation_id: str, tenant_id: str, items: list[dict[str, Any]]) -> None:
        """Appends ``items``. Raises ConversationMissing, or ItemsAlreadyInConversation
        naming ids the conversation holds (or held)."""
        async with self._pool.acquire() as conn, conn.transaction():
            await _lock(conn, conversation_id, tenant_id)
            await _refuse_known_ids(conn, conversation_id, items)
            await _insert_items(conn, conversation_id, await _next_position(conn, conversation_id), "item", None,
                                items)

    async def append_response(self, conversation_id: str, tenant_id: str, response_id: str,
                              input_items: list[dict[str, Any]]) -> None:
        """Makes the (stored, not yet queued) response a turn of the conversation: its
        input items, then its output, as the conversation's next entries. Raises
        ConversationMissing, ConversationBusy while another response of the conversation
        is running, or ItemsAlreadyInConversation."""
        async with self._pool.acquire() as conn, conn.transaction():
            await _lock(conn, conversation_id, tenant_id)
            running = await conn.fetchval(_RUNNING, conversation_id, _TERMINAL, response_id)
            if running is not None:
                raise ConversationBusy(running)
            await _refuse_known_ids(conn, conversation_id, input_items)
            await conn.execute("UPDATE responses SET conversation_id = $2 WHERE id = $1", response_id,
                               conversation_id)
            position = await _next_position(conn, conversation_id)
            await _insert_items(conn, conversation_id, position, "response_input", response_id, input_items)
            await conn.execute(
                "INSERT INTO conversation_entries (conversation_id, position, kind, response_id)"
                " VALUES ($1, $2, 'response_output', $3)",
                conversation_id, position + len(input_items), response_id,
            )

    async def running_response(self, conversation_id: str) -> str | None:
        """A response of the conversation that has not ended, if any."""
        running: str | None = await self._pool.fetchval(_RUNNING, conversation_id, _TERMINAL, "")
        return running

    async def items(self, conversation_id: str) -> list[dict[str, Any]]:
        """Every item of the conversation, in order."""
        return await self._visible(conversation_id)

    async def item(self, conversation_id: str, item_id: str) -> dict[str, Any] | None:
        return next((item for item in await self._visible(conversation_id) if item.get("id") == item_id), None)

    async def items_page(self, conversation_id: str, after: str | None, limit: int,
                         descending: bool) -> ItemsPage | None:
        """Up to ``limit`` items after the item ``after`` (in the order asked for); None
        when ``after`` names no item of the conversation."""
        items = await self._visible(conversation_id)
        if after is not None:
            anchor = next((index for index, item in enumerate(items) if item.get("id") == after), None)
            if anchor is None:
                return None
            items = items[:anchor] if descending else items[anchor + 1:]
        if descending:
            items.reverse()
        return ItemsPage(items[:limit], has_more=len(items) > limit)

    async def delete_item(self, conversation_id: str, item_id: str) -> bool:
        """Leaves the item out of the conversation from now on; False when it is not one
        of its items."""
        if not any(item.get("id") == item_id for item in await self._visible(conversation_id)):
            return False
        return bool(await self._pool.fetchval(
            "INSERT INTO conversation_deleted_items (conversation_id, item_id) VALUES ($1, $2)"
            " ON CONFLICT DO NOTHING RETURNING true",
            conversation_id, item_id,
        ))

    async def _visible(self, conversation_id: str) -> list[dict[str, Any]]:
        """The conversation's items in order, deleted ones left out."""
        entries = await self._pool.fetch(_ENTRIES, conversation_id, _TERMINAL)
        deleted = set(entries[0][2] or ()) if entries else set()
        items = [item for kind, text, _ in entries
                 for item in (output_items(text) if kind == "response_output" else [orjson.loads(text)])]
        return [item for item in items if item.get("id") not in deleted]


async def _lock(conn: Connection, conversation_id: str, tenant_id: str) -> None:
    locked = await conn.fetchval("SELECT true FROM conversations WHERE id = $1 AND tenant_id = $2 FOR UPDATE",
                                 conversation_id, tenant_id)
    if not locked:
        raise ConversationMissing(conversation_id)


async def _next_position(conn: Connection, conversation_id: str) -> int:
    position: int = await conn.fetchval(
        "SELECT coalesce(max(position) + 1, 0) FROM conversation_entries WHERE conversation_id = $1", conversation_id)
    return position


async def _refuse_known_ids(conn: Connection, conversation_id: str, items: list[dict[str, Any]]) -> None:
    """A conversation holds an item id once: an item is found, and deleted, by its id."""
    ids = [item["id"] for item in items]
    if known := await conn.fetch(_KNOWN_IDS, conversation_id, ids):
        raise ItemsAlreadyInConversation(sorted(row[0] for row in known))


async def _insert_items(conn: Connection, conversation_id: str, first_position: int, kind: str,
                        response_id: str | None, items: list[dict[str, Any]]) -> None:
    rows = [(first_position + index, item["id"], _json(item)) for index, item in enumerate(items)]
    if rows:
        await conn.execute(
            "INSERT INTO conversation_entries (conversation_id, position, kind, response_id, item_id, item)"
            " SELECT $1, position, $2, $3, item_id, item::json"
            " FROM unnest($4::int[], $5::text[], $6::text[]) AS i(position, item_id, item)",
            conversation_id, kind, response_id, *unnest_columns(rows, 3),
        )


# A conversation's entries ($1) in order: an item, or the final snapshot of a response
# whose output stands in the conversation once the response has ended ($2: the
# terminal statuses); each row also carries the ids of the conversation's deleted items.
_ENTRIES = """
SELECT e.kind, coalesce(e.item::text, r.snapshot::text),
       (SELECT array_agg(d.item_id) FROM conversation_deleted_items AS d WHERE d.conversation_id = $1)
FROM conversation_entries AS e
LEFT JOIN responses AS r ON e.kind = 'response_output' AND r.id = e.response_id AND r.status = ANY($2::text[])
WHERE e.conversation_id = $1 AND (e.kind <> 'response_output' OR r.snapshot IS NOT NULL)
ORDER BY e.position
"""

# A response of the conversation ($1) that has not ended ($2: the terminal statuses),
# other than $3.
_RUNNING = """
SELECT e.response_id FROM conversation_entries AS e JOIN responses AS r ON r.id = e.response_id
WHERE e.conversation_id = $1 AND e.kind = 'response_output' AND r.status <> ALL($2::text[]) AND r.id <> $3
LIMIT 1
"""

# Which of the ids ($2) the conversation ($1) holds or held: its items, its responses'
# output items, its deleted items.
_KNOWN_IDS = """
SELECT item_id FROM conversation_entries WHERE conversation_id = $1 AND item_id = ANY($2::text[])
UNION
SELECT o.item_id FROM response_output_items AS o
JOIN conversation_entries AS e ON e.response_id = o.response_id AND e.conversation_id = $1
                                 AND e.kind = 'response_output'
WHERE o.item_id = ANY($2::text[])
UNION
SELECT item_id FROM conversation_deleted_items WHERE conversation_id = $1 AND item_id = ANY($2::text[])
"""
