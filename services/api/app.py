"""The HTTP app: shared services opened in the lifespan, errors in OpenAI's shape,
request size limit, and the routes of ``routes.py``."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager, suppress

import asyncpg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from nats.errors import Error as NatsError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from steno.schemas.ids import new_origin
from steno.services.api.auth import Authenticator
from steno.services.api.errors import (
    ApiError,
    api_error_handler,
    error_body,
    http_error_handler,
    unexpected_error_handler,
    validation_error_handler,
)
from steno.services.api.keys import KeyResolver
from steno.services.api.routes import create_fast_path, router
from steno.services.api.store import ResponseStore
from steno.services.common import bus, db
from steno.services.common.config import Settings
from steno.services.common.harmony_vocab import harmony_encoding
from steno.services.common.kv_mirror import KvMirror
from steno.services.common.runtime import freeze_startup_heap
from steno.services.edge import EventReader, ResponseTail

log = logging.getLogger(__name__)

PURGE_EVERY_S = 30.0


class Services:
    """What the routes share, opened in the app's lifespan."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.names = bus.Names.from_settings(settings)

    async def open(self) -> None:
        self.encoding = await asyncio.to_thread(harmony_encoding)
        self.nc = await bus.connect(self.settings.nats_url, "steno-api")
        self.js = self.nc.jetstream()
        await bus.ensure_streams(self.js, self.names)
        self.cancel_flags = await bus.cancel_flags(self.js, self.names)
        self.workers = KvMirror(await bus.worker_registry(self.js, self.names), self.names.workers_bucket,
                                bus.WORKER_REGISTRATION_TTL_S)
        await self.workers.start()
        self.pool = await db.create_pool(self.settings.database_url, max_size=20)
        self.store = ResponseStore(self.pool)
        self.reader = EventReader(self.pool)
        # The ids this process makes carry it, so their events come on one subscription.
        self.origin = new_origin()
        self.tail = ResponseTail(self.nc, self.reader, self.names.events_subject, self.origin,
                                 self.names.origin_events(self.origin))
        await self.tail.start()
        self.authenticate = Authenticator(None if self.settings.auth_disabled else KeyResolver(self.pool))
        self._purger = asyncio.create_task(self._purge_expired())

    async def _purge_expired(self) -> None:
        """Deletes what must not outlive its stream (responses created with store=false)."""
        while True:
            await asyncio.sleep(PURGE_EVERY_S)
            with suppress(Exception):
                await self.store.purge_expired()

    async def close(self) -> None:
        self._purger.cancel()
        await self.workers.stop()
        await self.tail.stop()
        await self.nc.close()
        await self.pool.close()


class BodySizeLimit:
    """Rejects request bodies over ``limit`` bytes with a 413 before reading them all."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._reject(send)
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise _TooLarge()
            return message

        try:
            await self.app(scope, counting_receive, send)
        except _TooLarge:
            await self._reject(send)

    async def _reject(self, send: Send) -> None:
        response = JSONResponse(error_body(413, f"The request body exceeds {self.limit} bytes."), status_code=413)
        await response({"type": "http"}, None, send)


class _TooLarge(Exception):
    pass


async def unavailable_handler(_: Request, exc: Exception) -> JSONResponse:
    log.warning("backing service unavailable: %s", exc)
    return JSONResponse(
        error_body(503, "The service is temporarily unavailable; retry shortly."),
        status_code=503,
        headers={"Retry-After": "1"},
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    services = Services(settings or Settings.from_env())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await services.open()
        app.state.services = services
        freeze_startup_heap()
        try:
            yield
        finally:
            await services.close()

    app = FastAPI(title="Steno", version="0.1.0", lifespan=lifespan)
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    for unavailable in (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
                        asyncpg.CannotConnectNowError, asyncio.TimeoutError, NatsError):
        app.add_exception_handler(unavailable, unavailable_handler)
    app.add_exception_handler(Exception, unexpected_error_handler)
    app.add_middleware(BodySizeLimit, limit=services.settings.max_body_bytes)
    app.include_router(router)
    app.router.routes.insert(0, create_fast_path())
    return app
