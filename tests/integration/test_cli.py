"""The ``steno`` commands that manage a database, against one never migrated: each says
so in one line and exits 2, instead of printing a traceback."""

import asyncio
import subprocess
import sys

import asyncpg
import pytest

from steno.infra.processes import service_env
from steno.services.common.db import asyncpg_dsn
from steno.services.common.migrate import ensure_database

pytestmark = pytest.mark.integration


@pytest.fixture
def unmigrated(settings):
    database_url = settings.database_url.rsplit("/", 1)[0] + f"/{settings.namespace}_unmigrated"
    asyncio.run(ensure_database(database_url))
    yield settings.with_changes(database_url=database_url)

    async def drop() -> None:
        conn = await asyncpg.connect(asyncpg_dsn(settings.database_url))
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{settings.namespace}_unmigrated"')
        finally:
            await conn.close()
    asyncio.run(drop())


@pytest.mark.parametrize("command", [("tenants", "list"), ("keys", "list"), ("retention", "list"),
                                     ("retention", "sweep")])
def test_a_command_against_an_unmigrated_database_says_to_migrate(unmigrated, command):
    done = subprocess.run([sys.executable, "-m", "steno.services.cli", *command], env=service_env(unmigrated),
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"steno {command[0]}: ") and "run `steno migrate`" in lines[0]
