"""The API's side of Postgres: record new responses and read, page, cancel and delete
them, always within the caller's tenant."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from steno.schemas.chain import GENESIS, chain_hashes
from steno.schemas.events import LoggedEvent
from steno.services.common.db import UNSTORED_GRACE, unnest_columns
from steno.services.common.group_commit import GroupCommitter

TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})


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
class ChainLink:
    """The stored event a response's first event chains to (``schemas/chain.py``): the
    last event of the response it continues, as it stood when the response was made."""

    response_id: str
    seq: int
    # None when that event predates the chain: the first event then chains to GENESIS.
    hash: bytes | None


@dataclass(frozen=True)
class StoredResponse:
    response_id: str
    status: str
    background: bool
    base_snapshot: dict[str, Any]
    snapshot: dict[str, Any] | None

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True)
class StreamPosition:
    """The next message the parser applies: batch ``next_batch_no`` (or the end) of
    ``attempt``, after ``output_tokens`` tokens."""

    attempt: int
    next_batch_no: int
    output_tokens: int
    prompt_tokens: int


@dataclass(frozen=True)
class InputItemsPage:
    items: list[dict[str, Any]]
    has_more: bool


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def _conversation_of(request: dict[str, Any]) -> str | None:
    """The conversation a recorded request names (an id, or ``{"id": ...}``)."""
    named = request.get("conversation")
    if isinstance(named, dict):
        named = named.get("id")
    return named if isinstance(named, str) else None


def output_items(snapshot: str | None) -> list[dict[str, Any]]:
    """The output items of a stored snapshot's text. Read here, not with Postgres's JSON
    operators: they refuse the escape \\u0000, which a model may emit."""
    output = (orjson.loads(snapshot) if snapshot is not None else {}).get("output") or []
    return [item for item in output if isinstance(item, dict)]


class ResponseStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._creates: GroupCommitter[tuple[NewResponse, list[LoggedEvent], ChainLink | None]] = \
            GroupCommitter(self._create_many)

    async def create(self, new: NewResponse, first_events: list[LoggedEvent]) -> bytes:
        """The response row, its input items and its first events, atomically; responses
        created at the same moment share the statement. The events get their hashes,
        chained to the response this one continues; returns the last, which the parser's
        events chain to."""
        link = await self._chain_link(new)
        previous = link.hash if link is not None and link.hash is not None else GENESIS
        for event, digest in zip(first_events, chain_hashes(previous, (e.payload for e in first_events))):
            event.hash = digest
        await self._creates.commit([(new, first_events, link)])
        return first_events[-1].hash or previous

    async def _chain_link(self, new: NewResponse) -> ChainLink | None:
        """The last stored event of the response ``new`` continues: its previous response,
        or the latest response of its conversation. Read before the group commit, which
        cannot wait on a read per member; a conversation's turns are appended one at a
        time (``conversation_store.py``), so what is read is its previous turn."""
        if new.previous_response_id is not None:
            row = await self._pool.fetchrow(_LAST_EVENT, new.previous_response_id)
        elif (conversation_id := _conversation_of(new.request)) is not None:
            row = await self._pool.fetchrow(_LAST_EVENT_OF_CONVERSATION, conversation_id, new.response_id)
        else:
            return None
        return ChainLink(row[0], row[1], row[2]) if row is not None else None

    async def _create_many(self, creations: list[tuple[NewResponse, list[LoggedEvent], ChainLink | None]]) -> None:
        responses = [
            (new.response_id, new.tenant_id, new.model, new.status, new.background, new.store,
             new.previous_response_id, _json(new.request), _json(new.parse_context), _json(new.base_snapshot),
             link.response_id if link else None, link.seq if link else None, link.hash if link else None)
            for new, _, link in creations
        ]
        items = [(new.response_id, position, item["id"], _json(item))
                 for new, _, _ in creations for position, item in enumerate(new.input_items)]
        events = [(new.response_id, e.seq, e.type, e.payload, e.hash)
                  for new, first_events, _ in creations for e in first_events]
        await self._pool.execute(_CREATE, *unnest_columns(responses, 13), *unnest_columns(items, 4),
                                 *unnest_columns(events, 5))

    async def fail_unstarted(self, response_id: str, events: list[LoggedEvent], snapshot: dict[str, Any]) -> None:
        """Ends a response no worker will ever see (its work could not be published).
        The row is updated first: a response deleted meanwhile gets no events."""
        async with self._pool.acquire() as conn, conn.transaction():
            updated = await conn.fetchval(
                "UPDATE responses SET status = 'failed', snapshot = $2::json, error = $3::json,"
                " completed_at = now(), updated_at = now(),"
                f" expires_at = CASE WHEN store THEN expires_at ELSE now() + interval '{UNSTORED_GRACE}' END"
                " WHERE id = $1 RETURNING true",
                response_id,
                _json(snapshot),
                _json(snapshot.get("error")),
            )
            if updated and events:
                # Chained to the API's own last event, as the parser would chain them.
                previous = await conn.fetchval("SELECT hash FROM response_log WHERE response_id = $1 AND seq = $2",
                                               response_id, events[0].seq - 1)
                hashes = chain_hashes(previous, (e.payload for e in events)) if previous is not None \
                    else [None] * len(events)
                await conn.executemany(
                    "INSERT INTO response_events (response_id, seq, type, payload, hash) VALUES ($1, $2, $3, $4, $5)"
                    " ON CONFLICT DO NOTHING",
                    [(response_id, e.seq, e.type, e.payload, digest) for e, digest in zip(events, hashes)],
                )

    async def get(self, response_id: str, tenant_id: str) -> StoredResponse | None:
        """A stored response of this tenant; responses created with store=false are not
        retrievable, as with OpenAI."""
        row = await self._pool.fetchrow(
            "SELECT status, background, base_snapshot::text, snapshot::text FROM responses"
            " WHERE id = $1 AND tenant_id = $2 AND store",
            response_id,
            tenant_id,
        )
        if row is None:
            return None
        return StoredResponse(
            response_id, row[0], row[1], orjson.loads(row[2]), orjson.loads(row[3]) if row[3] is not None else None
        )

    async def last_seq(self, response_id: str) -> int:
        return await self._pool.fetchval(
            "SELECT coalesce(max(seq), -1) FROM response_log WHERE response_id = $1", response_id
        )

    async def conversation_before(self, response_id: str, tenant_id: str) -> list[StoredResponse]:
        """The chain ending at ``response_id`` (oldest first), via previous_response_id."""
        rows = await self._pool.fetch(
            "WITH RECURSIVE chain(id, previous, depth) AS ("
            "  SELECT id, previous_response_id, 0 FROM responses WHERE id = $1 AND tenant_id = $2 AND store"
            "  UNION ALL"
            "  SELECT r.id, r.previous_response_id, c.depth + 1 FROM responses r JOIN chain c ON r.id = c.previous"
            "  WHERE r.tenant_id = $2 AND r.store"
            ") SELECT r.id, r.status, r.background, r.base_snapshot::text, r.snapshot::text"
            " FROM chain c JOIN responses r ON r.id = c.id ORDER BY c.depth DESC",
            response_id,
            tenant_id,
        )
        return [
            StoredResponse(r[0], r[1], r[2], orjson.loads(r[3]), orjson.loads(r[4]) if r[4] is not None else None)
            for r in rows
        ]

    async def items_by_id(self, tenant_id: str, item_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The tenant's stored items (output items of its stored responses, then input
        items) with these ids, by id."""
        rows = await self._pool.fetch(_ITEMS_BY_ID, tenant_id, item_ids)
        found: dict[str, dict[str, Any]] = {}
        for item_id, text, rank in rows:
            if item_id in found:
                continue
            if rank == 1:
                found[item_id] = orjson.loads(text)
                continue
            item = next((item for item in output_items(text) if item.get("id") == item_id), None)
            if item is not None:
                found[item_id] = item
        return found

    async def input_items_of(self, response_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        rows = await self._pool.fetch(
            "SELECT response_id, item::text FROM response_input_items WHERE response_id = ANY($1::text[])"
            " ORDER BY response_id, position",
            response_ids,
        )
        items: dict[str, list[dict[str, Any]]] = {rid: [] for rid in response_ids}
        for row in rows:
            items[row[0]].append(orjson.loads(row[1]))
        return items

    async def input_items_page(
        self, response_id: str, after: str | None, limit: int, descending: bool
    ) -> InputItemsPage | None:
        """None when ``after`` names no item of this response."""
        order = "DESC" if descending else "ASC"
        compare = "<" if descending else ">"
        if after is None:
            rows = await self._pool.fetch(
                f"SELECT item::text FROM response_input_items WHERE response_id = $1 ORDER BY position {order}"
                " LIMIT $2",
                response_id,
                limit + 1,
            )
        else:
            position = await self._pool.fetchval(
                "SELECT position FROM response_input_items WHERE response_id = $1 AND item_id = $2",
                response_id,
                after,
            )
            if position is None:
                return None
            rows = await self._pool.fetch(
                f"SELECT item::text FROM response_input_items WHERE response_id = $1 AND position {compare} $2"
                f" ORDER BY position {order} LIMIT $3",
                response_id,
                position,
                limit + 1,
            )
        items = [orjson.loads(r[0]) for r in rows]
        return InputItemsPage(items[:limit], has_more=len(items) > limit)

    async def stream_position(self, response_id: str) -> StreamPosition:
        """Where the parser's record of a response's token stream stands."""
        row = await self._pool.fetchrow(_POSITION, response_id)
        assert row is not None  # an aggregate always has its row
        return StreamPosition(row[0], row[1], row[2], row[3])

    async def request_cancel(self, response_id: str) -> None:
        await self._pool.execute(
            "UPDATE responses SET cancel_requested_at = coalesce(cancel_requested_at, now()) WHERE id = $1",
            response_id,
        )

    async def delete(self, response_id: str, tenant_id: str) -> bool:
        """Deletes the response with its events, tokens and input items."""
        return bool(await self._delete_with_events(
            "DELETE FROM responses WHERE id = $1 AND tenant_id = $2 AND store RETURNING id", response_id, tenant_id
        ))

    async def purge_expired(self, limit: int) -> int:
        """Deletes up to ``limit`` expired responses, oldest expiry first; rows another
        replica's sweeper holds are left to it."""
        return len(await self._delete_with_events(_EXPIRED, limit))

    async def _delete_with_events(self, delete_responses: str, *args: Any) -> list[str]:
        """Tokens and input items go with their rows (foreign keys); events have none
        (migrations 0004 and 0012) and are deleted by the next statements, whose
        snapshots include what a parser that held a row committed before the row could
        be deleted."""
        async with self._pool.acquire() as conn, conn.transaction():
            gone = [row[0] for row in await conn.fetch(delete_responses, *args)]
            if gone:
                await conn.execute("DELETE FROM response_events WHERE response_id = ANY($1::text[])", gone)
                await conn.execute("DELETE FROM response_event_chunks WHERE response_id = ANY($1::text[])", gone)
        return gone

    async def compact_ended(self, limit: int, ended_for_s: float) -> int:
        """Moves the events of up to ``limit`` responses that ended more than
        ``ended_for_s`` ago from their rows into chunk rows (migration 0012), oldest end
        first, in one transaction; returns how many responses it took. Rows another
        replica's sweeper holds are left to it."""
        return len(await self._pool.fetch(_COMPACT, limit, ended_for_s))


_EXPIRED = """
DELETE FROM responses WHERE id IN (
    SELECT id FROM responses WHERE expires_at < now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id
"""

# Each contiguous run of a response's seqs is one chunk (the events of a response are
# contiguous; a run that is not would be kept apart, never renumbered).
_COMPACT = """
WITH ended AS (
    UPDATE responses SET events_compacted = true
    WHERE id IN (SELECT id FROM responses
                 WHERE completed_at < now() - make_interval(secs => $2) AND NOT events_compacted
                 ORDER BY completed_at LIMIT $1 FOR UPDATE SKIP LOCKED)
    RETURNING id
), moved AS (
    DELETE FROM response_events AS e USING ended WHERE e.response_id = ended.id
    RETURNING e.response_id, e.seq, e.type, e.payload, e.hash, e.created_at
), runs AS (
    SELECT *, seq - row_number() OVER (PARTITION BY response_id ORDER BY seq) AS run FROM moved
), chunks AS (
    INSERT INTO response_event_chunks (response_id, first_seq, types, payloads, hashes, created_ats)
    SELECT response_id, min(seq), array_agg(type ORDER BY seq), array_agg(payload ORDER BY seq),
           array_agg(hash ORDER BY seq), array_agg(created_at ORDER BY seq)
    FROM runs GROUP BY response_id, run
)
SELECT id FROM ended
"""

_POSITION = """
WITH latest AS (SELECT max(attempt) AS attempt FROM response_tokens WHERE response_id = $1)
SELECT coalesce(l.attempt, 0),
       coalesce((SELECT max(batch_no) + 1 FROM response_tokens WHERE response_id = $1 AND attempt = l.attempt), 0),
       (SELECT coalesce(sum(cardinality(token_ids)), 0) FROM response_tokens WHERE response_id = $1)::int,
       coalesce((SELECT (parse_context->>'prompt_tokens')::int FROM responses WHERE id = $1), 0)
FROM latest AS l
"""

_CREATE = """
WITH new_responses AS (
    INSERT INTO responses (id, tenant_id, model, status, background, store, previous_response_id,
                           request, parse_context, base_snapshot, chained_to_response_id, chained_to_seq,
                           chained_to_hash)
    SELECT id, tenant, model, status, background, store, previous, request::json, context::json, snapshot::json,
           chained_to, chained_seq, chained_hash
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[], $6::bool[], $7::text[], $8::text[],
                $9::text[], $10::text[], $11::text[], $12::int[], $13::bytea[])
         AS r(id, tenant, model, status, background, store, previous, request, context, snapshot, chained_to,
              chained_seq, chained_hash)
), new_items AS (
    INSERT INTO response_input_items (response_id, position, item_id, item)
    SELECT response_id, position, item_id, item::json
    FROM unnest($14::text[], $15::int[], $16::text[], $17::text[]) AS i(response_id, position, item_id, item)
)
INSERT INTO response_events (response_id, seq, type, payload, hash)
SELECT * FROM unnest($18::text[], $19::int[], $20::text[], $21::text[], $22::bytea[])
"""

_LAST_EVENT = "SELECT response_id, seq, hash FROM response_log WHERE response_id = $1 ORDER BY seq DESC LIMIT 1"

# Its latest response other than the one being made (conversation_store.py appends a
# response's entries after it is stored).
_LAST_EVENT_OF_CONVERSATION = """
SELECT e.response_id, e.seq, e.hash FROM response_log AS e
WHERE e.response_id = (SELECT c.response_id FROM conversation_entries AS c
                       WHERE c.conversation_id = $1 AND c.kind = 'response_output' AND c.response_id <> $2
                       ORDER BY c.position DESC LIMIT 1)
ORDER BY e.seq DESC LIMIT 1
"""


# Output items first: an id an item was given by this server names it before an input
# item a client happened to give the same id.
# Output items are picked out of their response's snapshot here, not by Postgres: its
# JSON operators refuse the escape \u0000, which a model may emit, and the plan may
# apply them to any of the tenant's responses.
_ITEMS_BY_ID = """
SELECT o.item_id, r.snapshot::text, 0 AS rank
FROM response_output_items AS o
JOIN responses AS r ON r.id = o.response_id AND r.tenant_id = $1 AND r.store
WHERE o.item_id = ANY($2::text[])
UNION ALL
SELECT i.item_id, i.item::text, 1 AS rank
FROM response_input_items AS i
JOIN responses AS r ON r.id = i.response_id AND r.tenant_id = $1 AND r.store
WHERE i.item_id = ANY($2::text[])
ORDER BY rank
"""
