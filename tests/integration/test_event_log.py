"""The parser's event log against a real Postgres: how its commits find their rows."""

from __future__ import annotations

import asyncio
import secrets

import asyncpg
import pytest

from steno.schemas.bus import TokenBatch
from steno.schemas.events import LoggedEvent
from steno.services.common.db import asyncpg_dsn
from steno.services.common.migrate import database_url_named, drop_database, ensure_database, upgrade
from steno.services.parser.event_log import EventLog, ResponseWrite, create_parser_pools

_ADD_RESPONSES = """
INSERT INTO responses (id, tenant_id, model, status, background, store, request, parse_context, base_snapshot)
SELECT 'resp_' || n, 'tenant', 'model', $3, false, true, '{}'::json, '{}'::json, '{}'::json
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


def _batch(response_id: str, batch_no: int) -> TokenBatch:
    return TokenBatch(response_id=response_id, attempt=0, batch_no=batch_no, token_ids=[batch_no])


def _event(seq: int) -> LoggedEvent:
    return LoggedEvent(seq=seq, type="response.output_text.delta", payload=f'{{"seq": {seq}}}', hash=bytes([seq]))


@pytest.fixture
async def fresh_database(infrastructure):
    """A database of its own: what a test counts there is its own doing."""
    url = database_url_named(infrastructure.database_url, f"steno_event_log_{secrets.token_hex(4)}")
    await ensure_database(url)
    await asyncio.to_thread(upgrade, url)
    yield url
    await drop_database(url)


async def test_endings_are_found_by_key_after_the_table_has_grown_under_the_connection(fresh_database):
    """A parser's connection lives as long as the parser. Its first commits may meet a
    nearly empty ``responses`` table; once that table holds thousands of rows, ending a
    response must still go to its row by the key, not scan the table."""
    admin = await asyncpg.connect(asyncpg_dsn(fresh_database))
    pools = await create_parser_pools(fresh_database)
    try:
        await admin.execute(_ADD_RESPONSES, 1, 20, "in_progress")
        log = EventLog(pools.planned, appends=pools.appends)
        for n in range(1, 11):  # more than enough for Postgres to settle on a plan for the statement
            await log.commit([_ending(f"resp_{n}")])
        await admin.execute(_ADD_RESPONSES, 21, 5_000, "in_progress")
        scans_before = await _sequential_scans_of_responses(admin, pools.planned)
        for n in range(4_990, 5_000):
            await log.commit([_ending(f"resp_{n}")])
        assert await _sequential_scans_of_responses(admin, pools.planned) == scans_before
        ended = await admin.fetchval("SELECT count(*) FROM responses WHERE status = 'completed'")
        assert ended == 20
    finally:
        await pools.close()
        await admin.close()


async def test_a_write_overlapping_what_is_stored_adds_only_the_rest(fresh_database):
    """Another writer (a parser that has not yet noticed it lost the partition) may have
    stored part of a write: committing it again stores what was missing, once."""
    admin = await asyncpg.connect(asyncpg_dsn(fresh_database))
    pools = await create_parser_pools(fresh_database)

    try:
        await admin.execute(_ADD_RESPONSES, 1, 1, "queued")
        log = EventLog(pools.planned, appends=pools.appends)
        await log.commit([ResponseWrite("resp_1", events=[_event(1)], consumed=[_batch("resp_1", 0)], started=True)])
        await log.commit([ResponseWrite("resp_1", events=[_event(1), _event(2)],
                                        consumed=[_batch("resp_1", 0), _batch("resp_1", 1)])])
        stored = await admin.fetch("SELECT seq, payload FROM response_events WHERE response_id = 'resp_1' ORDER BY seq")
        assert [(row["seq"], row["payload"]) for row in stored] == [(1, '{"seq": 1}'), (2, '{"seq": 2}')]
        batches = await admin.fetch("SELECT batch_no FROM response_tokens WHERE response_id = 'resp_1' ORDER BY 1")
        assert [row["batch_no"] for row in batches] == [0, 1]
        assert await admin.fetchval("SELECT status FROM responses WHERE id = 'resp_1'") == "in_progress"
    finally:
        await pools.close()
        await admin.close()


async def test_commits_that_only_insert_keep_their_plans_and_check_batches_by_key(fresh_database):
    """Most commits of a long stream only add events and batches: they go through a
    connection that keeps its plans, and each batch's response is still found by its key
    once the table has grown under that connection."""
    admin = await asyncpg.connect(asyncpg_dsn(fresh_database))
    pools = await create_parser_pools(fresh_database)
    try:
        await admin.execute(_ADD_RESPONSES, 1, 20, "in_progress")
        log = EventLog(pools.planned, appends=pools.appends)
        for n in range(1, 11):
            await log.commit([ResponseWrite(f"resp_{n}", events=[_event(1)], consumed=[_batch(f"resp_{n}", 0)])])
        await admin.execute(_ADD_RESPONSES, 21, 5_000, "in_progress")
        scans_before = await _sequential_scans_of_responses(admin, pools.appends)
        for n in range(4_990, 5_000):
            await log.commit([ResponseWrite(f"resp_{n}", events=[_event(1)], consumed=[_batch(f"resp_{n}", 0)])])
        assert await _sequential_scans_of_responses(admin, pools.appends) == scans_before
        plans = await pools.appends.fetchrow(
            "SELECT coalesce(sum(generic_plans), 0) AS generic FROM pg_prepared_statements"
            " WHERE statement LIKE 'WITH new_events%'")
        assert plans["generic"] > 0, "the appends' statement is planned again at every commit"
        assert await admin.fetchval("SELECT count(*) FROM response_tokens") == 20
    finally:
        await pools.close()
        await admin.close()
