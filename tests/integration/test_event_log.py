"""The parser's event log against a real Postgres: how its commits find their rows."""

from __future__ import annotations

import asyncio
import secrets

import asyncpg

from steno.services.common.db import asyncpg_dsn
from steno.services.common.migrate import ensure_database, upgrade
from steno.services.parser.event_log import EventLog, ResponseWrite, create_parser_pool
from tests.conftest import _with_database

_ADD_RESPONSES = """
INSERT INTO responses (id, tenant_id, model, status, background, store, request, parse_context, base_snapshot)
SELECT 'resp_' || n, 'tenant', 'model', 'in_progress', false, true, '{}'::json, '{}'::json, '{}'::json
FROM generate_series($1::int, $2::int) AS n
"""


async def _sequential_scans_of_responses(admin: asyncpg.Connection, writer: asyncpg.Pool) -> int:
    """What the writer's connection has counted so far: its statistics are sent on at its
    next statement's end rather than a second or more later."""
    await writer.execute("SELECT pg_stat_force_next_flush()")
    await writer.execute("SELECT 1")
    await admin.execute("SELECT pg_stat_clear_snapshot()")
    return await admin.fetchval("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'responses'")


def _ending(response_id: str) -> ResponseWrite:
    return ResponseWrite(response_id, final_snapshot={"id": response_id, "status": "completed", "output": []})


async def test_endings_are_found_by_key_after_the_table_has_grown_under_the_connection(infrastructure):
    """A parser's connection lives as long as the parser. Its first commits may meet a
    nearly empty ``responses`` table; once that table holds thousands of rows, ending a
    response must still go to its row by the key, not scan the table."""
    url = _with_database(infrastructure.database_url, f"steno_event_log_{secrets.token_hex(4)}")
    await ensure_database(url)
    await asyncio.to_thread(upgrade, url)
    admin = await asyncpg.connect(asyncpg_dsn(url))
    pool = await create_parser_pool(url, partitions=0)
    try:
        await admin.execute(_ADD_RESPONSES, 1, 20)
        log = EventLog(pool)
        for n in range(1, 11):  # more than enough for Postgres to settle on a plan for the statement
            await log.commit([_ending(f"resp_{n}")])
        await admin.execute(_ADD_RESPONSES, 21, 5_000)
        scans_before = await _sequential_scans_of_responses(admin, pool)
        for n in range(4_990, 5_000):
            await log.commit([_ending(f"resp_{n}")])
        assert await _sequential_scans_of_responses(admin, pool) == scans_before
        ended = await admin.fetchval("SELECT count(*) FROM responses WHERE status = 'completed'")
        assert ended == 20
    finally:
        await pool.close()
        await admin.close()
        dropper = await asyncpg.connect(_with_database(asyncpg_dsn(infrastructure.database_url), "postgres"))
        try:
            await dropper.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
        finally:
            await dropper.close()
