"""Readiness against a NATS server and a Postgres of the test's own: ready while both
run and the schema is current; not ready, naming the cause, while either is stopped or
the schema is behind; ready again once it is back."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from steno.infra.embedded import free_port
from steno.infra.processes import Stack
from steno.services.common.config import ApiSettings
from steno.services.common.db import asyncpg_dsn
from steno.services.common.health import head_revision
from steno.services.common.migrate import ensure_database, upgrade
from tests.fault.infra import Nats, Postgres

WAIT_S = 45.0


def readiness(url: str) -> tuple[int, dict]:
    """The status of ``/readyz`` and its body; 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())
    except OSError:
        return 0, {}


def wait_for(urls: list[str], status: int, failing: str | None = None) -> None:
    """Waits until every url's ``/readyz`` answers ``status`` (naming ``failing`` among its failing checks)."""
    deadline = time.monotonic() + WAIT_S
    pending = list(urls)
    while pending:
        code, body = readiness(pending[0])
        if code == status and (failing is None or failing in body.get("failing", [])):
            pending.pop(0)
            continue
        if time.monotonic() > deadline:
            raise AssertionError(f"{pending[0]}/readyz is {code} {body}, not {status} naming {failing}")
        time.sleep(0.3)


@pytest.fixture
def private_stack(settings: ApiSettings, tmp_path: Path) -> Iterator[tuple[Stack, Nats, Postgres]]:
    nats = Nats(tmp_path / "nats")
    # Outside pytest's own (private) folders: the embedded server runs as a user of its own.
    pg_dir = tempfile.TemporaryDirectory(prefix="steno-health-")
    postgres = Postgres(Path(pg_dir.name))
    database_url = postgres.url("steno")
    asyncio.run(ensure_database(database_url))
    upgrade(database_url)
    stack = Stack(settings.with_changes(nats_url=nats.url, database_url=database_url, namespace="health"),
                  tmp_path / "logs")
    (tmp_path / "logs").mkdir()
    try:
        yield stack, nats, postgres
    except Exception:
        print(stack.logs())
        raise
    finally:
        stack.stop()
        nats.stop()
        postgres.close()
        pg_dir.cleanup()


def test_readiness_follows_postgres_nats_and_migrations(private_stack: tuple[Stack, Nats, Postgres]) -> None:
    stack, nats, postgres = private_stack
    parser_port, worker_port = free_port(), free_port()
    stack.add("parser-0", "parser", "--metrics-port", str(parser_port))
    stack.add("worker-0", "worker", "--metrics-port", str(worker_port))
    stack.add_api()
    api = stack.base_url.removesuffix("/v1")
    parser, worker = f"http://127.0.0.1:{parser_port}", f"http://127.0.0.1:{worker_port}"
    wait_for([api, parser, worker], 200)
    _, body = readiness(api)
    assert set(body["checks"]) == {"nats", "postgres", "migrations", "subscriptions"}
    with urllib.request.urlopen(api + "/healthz", timeout=5) as alive:
        assert alive.status == 200

    postgres.stop()
    wait_for([api, parser], 503, failing="postgres")
    # The worker needs no Postgres.
    wait_for([worker], 200)
    with urllib.request.urlopen(parser + "/healthz", timeout=5) as alive:
        assert alive.status == 200
    postgres.start()
    wait_for([api, parser], 200)

    nats.stop()
    wait_for([api, parser, worker], 503, failing="nats")
    nats.nodes[0].start()
    wait_for([api, parser, worker], 200)

    database_url = stack.settings.database_url
    asyncio.run(_record_revision(database_url, "0001"))
    try:
        wait_for([api, parser], 503, failing="migrations")
        _, body = readiness(api)
        assert "steno migrate" in body["checks"]["migrations"]["reason"]
    finally:
        asyncio.run(_record_revision(database_url, head_revision()))
    wait_for([api, parser], 200)


async def _record_revision(database_url: str, revision: str) -> None:
    """Makes the database say it is at ``revision`` (as one migrated by an older release would)."""
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await conn.execute("UPDATE alembic_version SET version_num = $1", revision)
    finally:
        await conn.close()
