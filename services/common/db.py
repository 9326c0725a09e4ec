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


async def _keep_session(connection: asyncpg.Connection) -> None:
    """Steno sets no session state (no SET, LISTEN or session-level advisory locks; the
    quotas' advisory locks end with their transaction), so a released
    connection needs no reset query: that saves a round trip on every pool use. asyncpg
    still rolls back any transaction left open before calling this."""


async def create_pool(url: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    return await asyncpg.create_pool(asyncpg_dsn(url), min_size=min_size, max_size=max_size, reset=_keep_session)


def unnest_columns(rows: list[tuple], width: int) -> list[list]:
    """Rows as the column arrays that ``unnest($1::t1[], $2::t2[], ...)`` takes: many rows
    in one statement, one parameter per column."""
    return [list(column) for column in zip(*rows)] if rows else [[] for _ in range(width)]
