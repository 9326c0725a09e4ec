"""Liveness and readiness.

Liveness (``/healthz``) is the process answering at all. Readiness (``/readyz``) is a
set of named checks, each a small coroutine returning (ok, reason): the NATS
connection, Postgres answering, the schema at the migrations this package ships, the
service's consumers or subscriptions in place, a worker's engine alive. Every check is
bounded, so a probe answers within its timeout even when what it checks hangs."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import asyncpg
from alembic.config import Config
from alembic.script import ScriptDirectory
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from steno.services.common.migrate import MIGRATIONS_DIR

CheckResult = tuple[bool, str]
Check = Callable[[], Awaitable[CheckResult]]

CHECK_TIMEOUT_S = 2.0


async def nats_connected(nc: Client) -> CheckResult:
    if nc.is_connected:
        return True, "connected"
    return False, "reconnecting" if nc.is_reconnecting else "not connected"


async def postgres_reachable(pool: asyncpg.Pool) -> CheckResult:
    await pool.fetchval("SELECT 1", timeout=CHECK_TIMEOUT_S)
    return True, "answers"


@functools.cache
def head_revision() -> str:
    """The newest migration this package ships."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    heads = ScriptDirectory.from_config(config).get_heads()
    return ",".join(sorted(heads))


async def migrations_current(pool: asyncpg.Pool) -> CheckResult:
    try:
        rows = await pool.fetch("SELECT version_num FROM alembic_version", timeout=CHECK_TIMEOUT_S)
    except asyncpg.UndefinedTableError:
        return False, "the database was never migrated (run `steno migrate`)"
    revision = ",".join(sorted(row[0] for row in rows))
    head = head_revision()
    if revision != head:
        return False, f"the database is at revision {revision or 'none'}, this release needs {head} " \
                      "(run `steno migrate`)"
    return True, f"at {head}"


async def consumers_bound(js: JetStreamContext, stream: str, durables: Iterable[str]) -> CheckResult:
    """The durable consumers the service pulls from exist on ``stream``."""
    names = list(durables)

    async def exists(durable: str) -> bool:
        try:
            await js.consumer_info(stream, durable, timeout=CHECK_TIMEOUT_S)
        except NotFoundError:
            return False
        return True

    found = await asyncio.gather(*(exists(durable) for durable in names))
    missing = [durable for durable, present in zip(names, found, strict=True) if not present]
    if missing:
        return False, f"missing on {stream}: {', '.join(missing)}"
    return True, f"{len(names)} bound on {stream}"


async def flag(ready: Callable[[], bool], yes: str, no: str) -> CheckResult:
    """A check of something the service knows without any I/O (a subscription open, an
    engine loaded)."""
    return (True, yes) if ready() else (False, no)


@dataclass(frozen=True)
class Readiness:
    """A service's named checks."""

    checks: dict[str, Check]

    async def evaluate(self) -> tuple[bool, dict[str, Any]]:
        """Runs every check at once; whether all passed, and the body that says so."""
        names = list(self.checks)
        results = await asyncio.gather(*(_bounded(self.checks[name]) for name in names))
        return readiness_report(dict(zip(names, results, strict=True)))


async def _bounded(check: Check) -> CheckResult:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            return await check()
    except TimeoutError:
        return False, f"no answer within {CHECK_TIMEOUT_S:g}s"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def readiness_report(results: dict[str, CheckResult]) -> tuple[bool, dict[str, Any]]:
    """The body of ``/readyz``: each check with its reason, and the failing ones named."""
    failing = [name for name, (ok, _) in results.items() if not ok]
    body = {
        "status": "not ready" if failing else "ready",
        "checks": {name: {"ok": ok, "reason": reason} for name, (ok, reason) in results.items()},
        "failing": failing,
    }
    return not failing, body
