"""Deleting a response leaves nothing of it behind, even while it is still generating
(events have no foreign key of their own: migration 0004)."""

import asyncio

import asyncpg
import pytest

from steno.schemas.bus import TokenBatch
from steno.schemas.events import LoggedEvent
from steno.services.api.store import ResponseStore
from steno.services.common.db import asyncpg_dsn
from steno.services.parser.event_log import EventLog, ResponseWrite
from tests.conftest import SLOW_MODEL

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"
TABLES = ("response_events", "response_tokens", "response_input_items")


async def rows_of(db, response_id: str) -> dict[str, int]:
    return {table: await db.fetchval(f"SELECT count(*) FROM {table} WHERE response_id = $1", response_id)
            for table in TABLES}


async def test_deleting_a_response_mid_generation_leaves_no_events(client, db):
    created = client.responses.create(model=SLOW_MODEL, input="delete me while I speak " * 3, background=True)
    for _ in range(100):
        if await db.fetchval("SELECT count(*) FROM response_events WHERE response_id = $1", created.id) > 2:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the response never started")
    client.responses.delete(created.id)
    # It would have finished by now: whatever the parser still had for it was refused.
    await asyncio.sleep(4)
    assert await rows_of(db, created.id) == dict.fromkeys(TABLES, 0)


async def test_a_parser_commit_for_a_deleted_response_fails_whole(client, db, settings):
    done = client.responses.create(model=MODEL, input="gone before the parser wrote")
    client.responses.delete(done.id)
    pool = await asyncpg.create_pool(asyncpg_dsn(settings.database_url), min_size=1, max_size=1)
    try:
        late = ResponseWrite(done.id, events=[LoggedEvent(seq=50, type="response.output_text.delta", payload="{}")],
                             consumed=[TokenBatch(response_id=done.id, attempt=1, batch_no=0, token_ids=[1])])
        with pytest.raises(asyncpg.ForeignKeyViolationError):
            await EventLog(pool).commit([late])
    finally:
        await pool.close()
    assert await rows_of(db, done.id) == dict.fromkeys(TABLES, 0)


async def test_purge_removes_expired_responses_with_everything_of_theirs(client, db, settings):
    expired = client.responses.create(model=MODEL, input="expire me")
    kept = client.responses.create(model=MODEL, input="keep me")
    kept_rows = await rows_of(db, kept.id)
    assert all(kept_rows.values())
    await db.execute("UPDATE responses SET expires_at = now() - interval '1 second' WHERE id = $1", expired.id)
    pool = await asyncpg.create_pool(asyncpg_dsn(settings.database_url), min_size=1, max_size=1)
    try:
        assert await ResponseStore(pool).purge_expired(limit=100) >= 1
    finally:
        await pool.close()
    assert await rows_of(db, expired.id) == dict.fromkeys(TABLES, 0)
    assert await rows_of(db, kept.id) == kept_rows
