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


async def ensure_database(url: str) -> None:
    """Creates the database named in ``url`` when the server has no such database."""
    dsn = asyncpg_dsn(url)
    parts = urlsplit(dsn)
    name = parts.path.lstrip("/")
    try:
        conn = await asyncpg.connect(dsn)
    except asyncpg.InvalidCatalogNameError:
        admin = await asyncpg.connect(urlunsplit(parts._replace(path="/postgres")))
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        except asyncpg.DuplicateDatabaseError:
            pass
        finally:
            await admin.close()
    else:
        await conn.close()


def upgrade(url: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", "postgresql+asyncpg://" + asyncpg_dsn(url).split("://", 1)[1])
    command.upgrade(config, "head")
