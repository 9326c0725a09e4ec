"""Postgres connection pools (asyncpg) from a ``postgresql://`` URL."""

from __future__ import annotations

import asyncpg

# How long a response created with store=false outlives its end: its running stream
# reads it until then, and every API replica purges it after.
UNSTORED_GRACE = "5 minutes"


def asyncpg_dsn(url: str) -> str:
    """Accepts SQLAlchemy-style URLs too (``postgresql+asyncpg://``)."""
    scheme, sep, rest = url.partition("://")
    return "postgresql://" + rest if sep and scheme.startswith("postgresql") else url


# For a pool whose statements name their rows by arrays of keys, on tables that grow under
# them: a plan cached while a table was small (a generic plan, kept for the connection's
# life and redone only after an ANALYZE) scans the whole table once it is large, while a
# plan made for each execution sees its size and the arrays' lengths (docs/performance.md).
PLAN_EACH_EXECUTION = {"plan_cache_mode": "force_custom_plan"}


async def _keep_session(connection: asyncpg.Connection) -> None:
    """Steno sets no session state after connecting (no SET, LISTEN or session-level
    advisory locks; the quotas' advisory locks end with their transaction), so a released
    connection needs no reset query: that saves a round trip on every pool use. asyncpg
    still rolls back any transaction left open before calling this."""


async def create_pool(url: str, *, min_size: int = 1, max_size: int = 10,
                      server_settings: dict[str, str] | None = None) -> asyncpg.Pool:
    """``server_settings`` are set as each connection starts, for its whole life."""
    return await asyncpg.create_pool(asyncpg_dsn(url), min_size=min_size, max_size=max_size, reset=_keep_session,
                                     server_settings=server_settings)


def unnest_columns(rows: list[tuple], width: int) -> list[list]:
    """Rows as the column arrays that ``unnest($1::t1[], $2::t2[], ...)`` takes: many rows
    in one statement, one parameter per column."""
    return [list(column) for column in zip(*rows)] if rows else [[] for _ in range(width)]
