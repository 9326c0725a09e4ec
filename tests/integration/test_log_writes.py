"""The log-writes benchmark against real Postgres: each shape writes what it names, in a
scratch database that is gone afterwards."""

import pytest

from steno.benchmarks.log_writes import SHAPES, Sizes, measure

pytestmark = pytest.mark.integration

SIZES = Sizes(commits=3, responses_per_commit=2, events=4, payload_bytes=300, batches=2, batch_tokens=5)


async def scratch_databases(db) -> int:
    return await db.fetchval("SELECT count(*) FROM pg_database WHERE datname LIKE 'steno_logwrites_%'")


@pytest.mark.parametrize("without_batch_key", [False, True])
async def test_every_shape_is_measured_in_every_round_and_the_scratch_database_goes(db, settings,
                                                                                   without_batch_key):
    before = await scratch_databases(db)
    figures = await measure(settings.database_url, SIZES, rounds=2, without_batch_key=without_batch_key)
    assert [f.shape for f in figures] == [*SHAPES, *SHAPES]
    assert all(f.responses == SIZES.commits * SIZES.responses_per_commit for f in figures)
    wal = {f.shape: f.wal_bytes for f in figures[:len(SHAPES)]}
    # Four events of 300 bytes outweigh two batches of five tokens; an end adds the
    # response's row and its output items to what the events and batches wrote.
    assert wal["events"] > SIZES.events * SIZES.payload_bytes * SIZES.responses_per_commit * SIZES.commits
    assert 0 < wal["batches"] < wal["events"] < wal["both"] < wal["ending"]
    assert await scratch_databases(db) == before
