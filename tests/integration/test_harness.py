"""What a benchmark run records of the servers it ran on."""

from __future__ import annotations

import re

import asyncpg
import pytest

from steno.benchmarks.harness import Bench
from steno.services.common import bus
from steno.services.common.migrate import drop_database, ensure_database

pytestmark = pytest.mark.integration


async def test_a_run_names_the_nats_and_postgres_versions_it_uses(tmp_path, settings):
    bench = Bench(tmp_path)
    await ensure_database(bench.database_url)
    try:
        versions = await bench.server_versions()
        nc = await bus.connect(bench.settings, "steno-test")
        reported = nc._server_info["version"]
        await nc.close()
        conn = await asyncpg.connect(bench.database_url)
        server_version_num = await conn.fetchval("SHOW server_version_num")
        await conn.close()
    finally:
        await drop_database(bench.database_url)
        bench.infra.stop()
    assert re.fullmatch(r"\d+\.\d+\.\d+", versions["nats"])
    assert reported.startswith(versions["nats"])
    assert int(versions["postgres"].split(".")[0]) == int(server_version_num) // 10000
