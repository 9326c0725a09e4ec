"""What the audit needs beyond its reads: a chat-template model's files, which live on
the bus (a response re-parses with the very files it was made with), and, for the
pages, a pool of their own."""

from __future__ import annotations

import asyncio

import asyncpg
from nats.aio.client import Client

from steno.services.common import bus, db
from steno.services.common.config import Settings
from steno.services.common.model_files import ensure_model_files


class BusModelFiles:
    """Puts a model's files (by digest) into the local model files directory, connecting
    to NATS the first time a response needs them (most audits never do)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._nc: Client | None = None
        self._lock = asyncio.Lock()

    async def __call__(self, digest: str) -> None:
        async with self._lock:
            if self._nc is None:
                self._nc = await bus.connect(self._settings, "steno-audit", max_reconnect_attempts=0)
        await ensure_model_files(self._nc.jetstream(), bus.Names.from_settings(self._settings), digest)

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()
            self._nc = None


class PageResources:
    """The pages' pool and model files, opened on the first page asked for: an API that
    is never audited holds no connection for it."""

    POOL_SIZE = 2

    def __init__(self, settings: Settings) -> None:
        self.model_files = BusModelFiles(settings)
        self._settings = settings
        self._pool: asyncpg.Pool | None = None
        self._lock = asyncio.Lock()

    async def pool(self) -> asyncpg.Pool:
        async with self._lock:
            if self._pool is None:
                self._pool = await db.create_pool(self._settings.database_url, max_size=self.POOL_SIZE)
            return self._pool

    async def close(self) -> None:
        await self.model_files.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
