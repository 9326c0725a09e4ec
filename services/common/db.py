"""Postgres connection pools (asyncpg) from a ``postgresql://`` URL."""

from __future__ import annotations

import asyncpg


def asyncpg_dsn(url: str) -> str:
    """Accepts SQLAlchemy-style URLs too (``postgresql+asyncpg://``)."""
    scheme, sep, rest = url.partition("://")
    return "postgresql://" + rest if sep and scheme.startswith("postgresql") else url


async def create_pool(url: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    return await asyncpg.create_pool(asyncpg_dsn(url), min_size=min_size, max_size=max_size)
