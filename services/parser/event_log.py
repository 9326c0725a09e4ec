"""The parser's side of Postgres: read what it needs to (re)build a response's state,
and append events (with their hashes) and the token batches that produced them in one
transaction."""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import orjson
from asyncpg.pool import PoolConnectionProxy

from steno.schemas.bus import GenerationEnded, TokenBatch, TokenStreamMessage
from steno.schemas.events import LoggedEvent
from steno.services.common.db import PLAN_EACH_EXECUTION, UNSTORED_GRACE, create_pool, unnest_columns
from steno.services.common.metrics import COMMIT_BATCH, COMMIT_LATENCY


@dataclass(frozen=True)
class ResponseRecord:
    """What a response's state is rebuilt from: its request context, the token
    messages already consumed for it, in order, and the hash of the event the API
    stored (seq 0), which the parser's events chain from: replaying the batches brings
    the chain to the stored events' last hash."""

    response_id: str
    status: str
    base_snapshot: dict[str, Any]
    parse_context: dict[str, Any]
    consumed: list[TokenStreamMessage]
    # None for a response stored before the chain (migration 0009).
    chain_head: bytes | None = None


@dataclass
class ResponseWrite:
    """Everything one commit adds for one response."""

    response_id: str
    events: list[LoggedEvent] = field(default_factory=list)
    consumed: list[TokenStreamMessage] = field(default_factory=list)
    started: bool = False
    final_snapshot: dict[str, Any] | None = None


def _token_row(response_id: str, message: TokenStreamMessage) -> tuple:
    """A consumed message as a ``response_tokens`` row: a batch, a batch with its
    attempt's end (``ended`` set, at ``batch_no``), or an end alone (at ``batch_count``)."""
    if isinstance(message, TokenBatch):
        logprobs = None
        if message.logprobs is not None:
            logprobs = orjson.dumps({"logprobs": message.logprobs, "top_logprobs": message.top_logprobs}).decode()
        ids = "{" + ",".join(map(str, message.token_ids)) + "}"
        ended = message.ended.model_dump_json() if message.ended is not None else None
        return (response_id, message.attempt, message.batch_no, ids, logprobs, ended)
    return (response_id, message.attempt, message.batch_count, "{}", None, message.model_dump_json())


def _stored_message(response_id: str, row: list) -> TokenStreamMessage:
    attempt, batch_no, token_ids, logprobs, ended = row
    end = GenerationEnded.model_validate(ended) if ended is not None else None
    if end is not None and end.batch_count == batch_no:
        return end
    logprobs = logprobs or {}
    return TokenBatch(
        response_id=response_id,
        attempt=attempt,
        batch_no=batch_no,
        token_ids=token_ids,
        logprobs=logprobs.get("logprobs"),
        top_logprobs=logprobs.get("top_logprobs"),
        ended=end,
    )


@dataclass(frozen=True)
class ParserPools:
    """The parser's connections. ``planned`` plans each statement as it runs: the load
    and the commits that update ``responses`` name their rows by arrays of ids in tables
    that grow under the parser's long-lived connections. ``appends`` keeps its plans, for
    the commits that only insert (most of a long stream's): nothing there finds rows by
    the arrays (the batches' foreign key is checked through the key's index, however
    small the table was when that plan was made), so planning them again buys nothing."""

    planned: asyncpg.Pool
    appends: asyncpg.Pool

    async def close(self) -> None:
        await self.planned.close()
        await self.appends.close()


async def create_parser_pools(url: str) -> ParserPools:
    """The parser reads and commits from one loop, one statement at a time: a planned
    connection for its reads and two beside it for the readiness probe's checks, which
    run together, and one append connection."""
    return ParserPools(planned=await create_pool(url, max_size=3, server_settings=PLAN_EACH_EXECUTION),
                       appends=await create_pool(url, max_size=1))


class EventLog:
    def __init__(self, pool: asyncpg.Pool | PoolConnectionProxy[asyncpg.Record],
                 appends: asyncpg.Pool | None = None) -> None:
        """``pool``: or a connection taken from one, for reads that must see one
        snapshot (an audit). ``appends``: where commits that only insert go
        (``ParserPools``); without it, ``pool``."""
        self._pool = pool
        self._appends = appends or pool

    async def load(self, response_id: str) -> ResponseRecord | None:
        """The response and everything consumed for it, in one round trip."""
        return (await self.load_many([response_id])).get(response_id)

    async def load_many(self, response_ids: list[str]) -> dict[str, ResponseRecord]:
        """``load`` for several responses in one round trip; a missing one is left out."""
        records = {}
        for row in await self._pool.fetch(_LOAD, response_ids):
            response_id = row[0]
            consumed = [_stored_message(response_id, message) for message in orjson.loads(row[4])]
            records[response_id] = ResponseRecord(response_id, row[1], orjson.loads(row[2]), orjson.loads(row[3]),
                                                  consumed, row[5])
        return records

    async def commit(self, writes: list[ResponseWrite]) -> None:
        """Everything in one statement: one round trip, atomic. Events carry no foreign
        key (migration 0004); the batches that produced them do, so the statement fails
        whole for a response that was deleted.

        Rows are inserted plainly: ``ON CONFLICT DO NOTHING`` costs a speculative
        insertion per row (an extra WAL record and index probe; docs/performance.md has
        its share of a burst's commit). Only a write that overlaps one already stored (another writer
        during a takeover, an audit's restore) meets a conflict; the statement then runs
        again, skipping what is there, and since events are deterministic the log ends
        the same either way."""
        events = [(w.response_id, e.seq, e.type, e.payload, e.hash) for w in writes for e in w.events]
        tokens = [_token_row(w.response_id, m) for w in writes for m in w.consumed]
        started = [(w.response_id,) for w in writes if w.started and w.final_snapshot is None]
        finals = [
            (w.response_id, w.final_snapshot["status"], orjson.dumps(w.final_snapshot).decode(),
             orjson.dumps(w.final_snapshot.get("usage")).decode(), orjson.dumps(w.final_snapshot.get("error")).decode())
            for w in writes
            if w.final_snapshot is not None
        ]
        # Output items by id, for item_reference (migration 0007).
        items = [(item["id"], w.response_id) for w in writes if w.final_snapshot is not None
                 for item in w.final_snapshot.get("output", []) if isinstance(item.get("id"), str)]
        rows_of_parts: tuple[list[tuple[Any, ...]], ...] = (events, tokens, started, finals, items)
        rows_by_part = [(part, rows) for part, rows in zip(_PARTS, rows_of_parts, strict=True) if rows]
        if not rows_by_part:
            return
        parts = tuple(part for part, _ in rows_by_part)
        columns = [column for part, rows in rows_by_part for column in unnest_columns(rows, len(part.types))]
        started_at = time.perf_counter()
        # Skipping what is stored reads the chunks by the arrays' keys: planned as it runs.
        first_try = self._appends if set(parts) <= _APPENDS else self._pool
        try:
            await first_try.execute(_commit_statement(parts, skipping_stored=False), *columns)
        except asyncpg.UniqueViolationError:
            await self._pool.execute(_commit_statement(parts, skipping_stored=True), *columns)
        COMMIT_LATENCY.observe(time.perf_counter() - started_at)
        COMMIT_BATCH.observe(len(writes))


_LOAD = """
SELECT r.id, r.status, r.base_snapshot::text, r.parse_context::text,
       coalesce((SELECT json_agg(json_build_array(t.attempt, t.batch_no, t.token_ids, t.logprobs, t.ended)
                                 ORDER BY t.attempt, t.batch_no)
                 FROM response_tokens AS t WHERE t.response_id = r.id), '[]')::text,
       (SELECT e.hash FROM response_log AS e WHERE e.response_id = r.id AND e.seq = 0)
FROM responses AS r WHERE r.id = ANY($1::text[])
"""


@dataclass(frozen=True)
class _Part:
    """One part of the commit's statement: a CTE whose rows come as arrays, one per
    column (``{arrays}`` in ``sql``), typed ``types``."""

    sql: str
    types: tuple[str, ...]


_EVENTS = _Part("""new_events AS (
    INSERT INTO response_events (response_id, seq, type, payload, hash)
    SELECT * FROM unnest({arrays}) AS u(r, s, t, p, h)
    {events_stored}
    {on_conflict}
)""", ("text", "int", "text", "text", "bytea"))
_TOKENS = _Part("""new_tokens AS (
    INSERT INTO response_tokens (response_id, attempt, batch_no, token_ids, logprobs, ended)
    SELECT r, a, b, t::int[], l::json, e::json
    FROM unnest({arrays}) AS u(r, a, b, t, l, e)
    {on_conflict}
)""", ("text", "int", "int", "text", "text", "text"))
_STARTED = _Part("""started AS (
    UPDATE responses SET status = 'in_progress', updated_at = now()
    WHERE id = ANY({arrays}) AND status = 'queued'
)""", ("text",))
_FINISHED = _Part(f"""finished AS (
    UPDATE responses AS r
    SET status = f.status, snapshot = f.snapshot::json, usage = f.usage::json, error = f.error::json,
        completed_at = now(), updated_at = now(),
        -- A response that is not to be stored lives on only for its running stream.
        expires_at = CASE WHEN r.store THEN r.expires_at ELSE now() + interval '{UNSTORED_GRACE}' END
    FROM unnest({{arrays}}) AS f(id, status, snapshot, usage, error)
    WHERE r.id = f.id
)""", ("text", "text", "text", "text", "text"))
_ITEMS = _Part("""indexed_items AS (
    INSERT INTO response_output_items (item_id, response_id)
    SELECT * FROM unnest({arrays})
    {on_conflict}
)""", ("text", "text"))
_PARTS = (_EVENTS, _TOKENS, _STARTED, _FINISHED, _ITEMS)
# The parts that only insert, reading no table by the arrays' keys.
_APPENDS = {_EVENTS, _TOKENS}

# The rows' key cannot see the events compaction moved into a chunk (migration 0012): a
# write that comes after its response was compacted (a redelivery long after the end)
# skips those by their chunks.
_EVENTS_NOT_IN_CHUNKS = """
    WHERE NOT EXISTS (SELECT 1 FROM response_event_chunks AS c
                      WHERE c.response_id = u.r AND u.s >= c.first_seq AND u.s < c.first_seq + cardinality(c.types))"""


@functools.cache
def _commit_statement(parts: tuple[_Part, ...], skipping_stored: bool) -> str:
    """The statement of a commit that has rows for ``parts``. A part without rows is
    left out rather than given empty arrays: the parser's statements are planned as they
    run, and most commits (a few batches of running responses) hold only events and
    batches."""
    numbers = itertools.count(1)
    ctes = []
    for part in parts:
        arrays = ", ".join(f"${next(numbers)}::{type_}[]" for type_ in part.types)
        ctes.append(part.sql.format(arrays=arrays, on_conflict="ON CONFLICT DO NOTHING" if skipping_stored else "",
                                    events_stored=_EVENTS_NOT_IN_CHUNKS if skipping_stored else ""))
    return "WITH " + ",\n".join(ctes) + "\nSELECT 1"
