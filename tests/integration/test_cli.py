"""The ``steno`` commands that manage a database, against one never migrated: each says
so in one line and exits 2, instead of printing a traceback."""

import asyncio
import subprocess
import sys

import pytest

from steno.infra.processes import service_env
from steno.services.common.migrate import database_url_named, drop_database, ensure_database

pytestmark = pytest.mark.integration


@pytest.fixture
def unmigrated(settings):
    database_url = database_url_named(settings.database_url, f"{settings.namespace}_unmigrated")
    asyncio.run(ensure_database(database_url))
    yield settings.with_changes(database_url=database_url)
    asyncio.run(drop_database(database_url))


@pytest.mark.parametrize("command", [("tenants", "list"), ("keys", "list"), ("retention", "list"),
                                     ("retention", "sweep")])
def test_a_command_against_an_unmigrated_database_says_to_migrate(unmigrated, command):
    done = subprocess.run([sys.executable, "-m", "steno.services.cli", *command], env=service_env(unmigrated),
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"steno {command[0]}: ") and "run `steno migrate`" in lines[0]
