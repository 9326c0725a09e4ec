"""What the bus and the database did for a scenario's requests, per request.

CPU per request says how much a request costs; these counts say what for: the messages
each JetStream stream (and KV bucket, and object store) of the stack stored, the WAL
Postgres wrote, and the shape of each response's log (its events, and the token batches
it was parsed from). A change in the pipeline's shape (a response's tokens in two
batches where there was one, more messages per response) shows here at once, where CPU
figures on a shared machine need many runs to show it.

Every count is exact: a stream's last sequence and the WAL position move as they are
written, and the log's shape is read from the responses created after the first
reading. (Postgres's per-table statistics would say more, but a backend flushes them
up to ten seconds late.) The baseline uses neither server, so what moved between two
readings was Steno's, its standing work included (lease renewals), which is small
beside a level's requests."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from steno.services.common.bus import Names

_SHAPE = """
WITH created AS (SELECT id FROM responses WHERE created_at >= $1)
SELECT (SELECT count(*) FROM created) AS responses,
       (SELECT count(*) FROM response_log AS l JOIN created ON l.response_id = created.id) AS events,
       (SELECT count(*) FROM response_tokens AS t JOIN created ON t.response_id = created.id) AS token_batches
"""


@dataclass(frozen=True)
class Reading:
    """The counters at one moment: each stream's messages stored in all (whatever has
    since been acknowledged away), the WAL position in bytes, and the database's clock."""

    messages: dict[str, int]
    wal_bytes: int
    at: datetime


def stack_streams(names: Names) -> dict[str, str]:
    """The JetStream streams of a stack, by a label without its namespace: the work and
    token streams, and those behind its KV buckets and object stores."""
    prefix = f"{names.namespace}_"
    streams = {"gen": names.gen_stream, "tokens": names.tokens_stream}
    for bucket in names.buckets:
        streams[f"kv:{bucket.removeprefix(prefix)}"] = f"KV_{bucket}"
    for store in (names.requests_store, names.model_files_store):
        streams[f"objects:{store.removeprefix(prefix)}"] = f"OBJ_{store}"
    return streams


async def read(js: JetStreamContext, conn: asyncpg.Connection, names: Names) -> Reading:
    messages = {}
    for label, stream in stack_streams(names).items():
        with suppress(NotFoundError):  # a bucket or store the run never opened
            messages[label] = (await js.stream_info(stream)).state.last_seq
    row = await conn.fetchrow("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, clock_timestamp()")
    assert row is not None
    return Reading(messages, row[0], row[1])


async def log_shape(conn: asyncpg.Connection, since: datetime) -> dict[str, int]:
    """The responses created since ``since``, their events and their token batches."""
    row = await conn.fetchrow(_SHAPE, since)
    assert row is not None
    return dict(row)


def per_request(before: Reading, after: Reading, shape: Mapping[str, int], requests: int) -> dict[str, Any]:
    """What moved between two readings, per request (streams that stored nothing left
    out), and the log's events and token batches per response."""
    if requests <= 0:
        return {}
    messages = {label: round((stored - before.messages.get(label, 0)) / requests, 2)
                for label, stored in sorted(after.messages.items()) if stored > before.messages.get(label, 0)}
    responses = shape.get("responses", 0)
    return {"nats_messages": messages,
            "wal_bytes": round((after.wal_bytes - before.wal_bytes) / requests),
            "responses": round(responses / requests, 2),
            "events_per_response": round(shape.get("events", 0) / responses, 2) if responses else 0,
            "token_batches_per_response": round(shape.get("token_batches", 0) / responses, 2) if responses else 0}


def printed(work: Mapping[str, Any]) -> str:
    """One line of the figures a reader looks at first."""
    messages = work.get("nats_messages", {})
    return (f"per request: token messages {messages.get('tokens', 0):g}, WAL {work.get('wal_bytes', 0):,} bytes; "
            f"per response: token batches {work.get('token_batches_per_response', 0):g}, "
            f"events {work.get('events_per_response', 0):g}")
