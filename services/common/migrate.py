"""Brings a database to the newest schema (Alembic), creating the database if needed."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from alembic import command
from alembic.config import Config

from steno import migrations
from steno.services.common.db import asyncpg_dsn

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def database_url_named(url: str, name: str) -> str:
    """``url`` (as asyncpg takes it) naming the database ``name`` on the same server."""
    return urlunsplit(urlsplit(asyncpg_dsn(url))._replace(path="/" + name))


def database_name(url: str) -> str:
    return urlsplit(asyncpg_dsn(url)).path.lstrip("/")


async def ensure_database(url: str) -> None:
    """Creates the database named in ``url`` when the server has no such database."""
    dsn = asyncpg_dsn(url)
    name = database_name(dsn)
    try:
        conn = await asyncpg.connect(dsn)
    except asyncpg.InvalidCatalogNameError:
        admin = await asyncpg.connect(database_url_named(dsn, "postgres"))
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        except asyncpg.DuplicateDatabaseError:
            pass
        finally:
            await admin.close()
    else:
        await conn.close()


async def drop_database(url: str) -> None:
    """Drops the database ``url`` names, whoever is still connected to it (scratch
    databases of tests and benchmarks)."""
    admin = await asyncpg.connect(database_url_named(url, "postgres"))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{database_name(url)}" WITH (FORCE)')
    finally:
        await admin.close()


def upgrade(url: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", "postgresql+asyncpg://" + asyncpg_dsn(url).split("://", 1)[1])
    command.upgrade(config, "head")
