"""The HTTP app: the Responses service opened in the lifespan, errors in OpenAI's
shape, the request size limit, and the routes of ``routes.py``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steno.schemas.ids import new_origin
from steno.services import audit, dialects
from steno.services.api.auth import AuthenticateFirst, Authenticator
from steno.services.api.conversation_store import ConversationStore
from steno.services.api.conversations import ConversationsService
from steno.services.api.errors import (
    UNAVAILABLE,
    ApiError,
    api_error_handler,
    client_gone_handler,
    error_body,
    http_error_handler,
    unavailable_handler,
    unexpected_error_handler,
    validation_error_handler,
)
from steno.services.api.keys import KeyResolver
from steno.services.api.models import ModelDirectory
from steno.services.api.queue_checks import QueueChecks
from steno.services.api.queue_depths import refresh_queue_depths
from steno.services.api.quotas import QuotaGate
from steno.services.api.rendering import PromptRenderer
from steno.services.api.request_metrics import RequestMetrics
from steno.services.api.responses import ResponsesService
from steno.services.api.retention import RetentionSweeper
from steno.services.api.routes import create_fast_path, router
from steno.services.api.store import ResponseStore
from steno.services.common import bus, db
from steno.services.common.config import ApiSettings
from steno.services.common.followers import FollowRegistry
from steno.services.common.health import (
    Readiness,
    flag,
    migrations_current,
    nats_connected,
    postgres_reachable,
)
from steno.services.common.kv_mirror import KvMirror
from steno.services.common.reasoning_keys import ReasoningKeys
from steno.services.common.runtime import tune_garbage_collector
from steno.services.common.stored_publish import StoredPublisher
from steno.services.edge import EventReader, ResponseTail

log = logging.getLogger(__name__)


class Api:
    """What the routes share, opened in the app's lifespan: the Responses and
    Conversations services and who is calling, over one NATS connection and one
    Postgres pool, and what ``/readyz`` checks."""

    readiness: Readiness

    def __init__(self, responses: ResponsesService, authenticate: Authenticator, sweeper: RetentionSweeper,
                 resources: AsyncExitStack, conversations: ConversationsService) -> None:
        self.responses = responses
        self.conversations = conversations
        self.authenticate = authenticate
        self._resources = resources
        self._sweeper = asyncio.create_task(sweeper.run())

    @classmethod
    async def open(cls, settings: ApiSettings) -> Api:
        resources = AsyncExitStack()
        try:
            await asyncio.to_thread(dialects.load_all)
            nc = await bus.connect(settings, "steno-api")
            resources.push_async_callback(nc.close)
            js = nc.jetstream()
            names = await bus.deployment_names(js, bus.Names.from_settings(settings))
            await bus.ensure_streams(js, names)
            publisher = StoredPublisher(nc)
            await publisher.start()
            resources.push_async_callback(publisher.stop)
            workers = KvMirror(await bus.worker_registry(js, names), names.workers_bucket,
                               bus.WORKER_REGISTRATION_TTL_S)
            await workers.start()
            resources.push_async_callback(workers.stop)
            pool = await db.create_pool(settings.database_url, max_size=20)
            resources.push_async_callback(pool.close)
            reader = EventReader(pool)
            # The ids this process makes carry it, so their events come on one subscription,
            # with those of the responses it follows from elsewhere.
            origin = new_origin()
            checks = asyncio.create_task(QueueChecks(pool, publisher, names, origin).run())
            resources.push_async_callback(_cancelled, checks)
            followers = FollowRegistry(await bus.follower_registry(js, names), origin)
            await followers.start()
            resources.push_async_callback(followers.stop)
            tail = ResponseTail(nc, reader, origin, names.events_subject(origin), followers)
            await tail.start()
            resources.push_async_callback(tail.stop)
            store = ResponseStore(pool)
            renderer = PromptRenderer(settings.render_processes, settings.render_timeout_s)
            resources.callback(renderer.close)
            conversations = ConversationsService(ConversationStore(pool), store)
            directory = ModelDirectory(workers, settings.model_wait_s)
            depths = asyncio.create_task(refresh_queue_depths(
                js, names, lambda: [registration.model for registration in directory.served()]))
            resources.push_async_callback(_cancelled, depths)
            responses = ResponsesService(
                names=names, js=js, publisher=publisher, store=store, reader=reader, tail=tail,
                models=directory, renderer=renderer,
                cancel_flags=await bus.cancel_flags(js, names), request_store=await bus.request_store(js, names),
                message_limit=bus.message_limit(nc), origin=origin, reasoning_keys=ReasoningKeys(pool),
                conversations=conversations, quotas=QuotaGate(pool),
            )
        except BaseException:
            await resources.aclose()
            raise
        authenticate = Authenticator(None if settings.auth_disabled else KeyResolver(pool))
        api = cls(responses, authenticate, RetentionSweeper(pool, store), resources, conversations)
        api.readiness = Readiness({
            "nats": partial(nats_connected, nc),
            "postgres": partial(postgres_reachable, pool),
            "migrations": partial(migrations_current, pool),
            "subscriptions": partial(flag, lambda: tail.following_origin, "following this process's events",
                                     "not following this process's events"),
        })
        return api

    async def close(self) -> None:
        self._sweeper.cancel()
        await asyncio.gather(self._sweeper, return_exceptions=True)
        await self._resources.aclose()


async def _cancelled(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


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
            return await self._reject(scope, receive, send)
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise _TooLarge()
            return message

        try:
            await self.app(scope, counting_receive, send)
        except _TooLarge:
            await self._reject(scope, receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse(error_body(413, f"The request body exceeds {self.limit} bytes."), status_code=413)
        await response(scope, receive, send)


class _TooLarge(Exception):
    pass


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        api = await Api.open(settings)
        app.state.api = api
        tune_garbage_collector()
        try:
            yield
        finally:
            await api.close()

    # FastAPI's own request span starts each response's trace (services/common/tracing.py);
    # none for each dependency, and no OpenTelemetry log records, which would hold the
    # input of a request it refuses.
    app = FastAPI(title="Steno", version="0.1.0", lifespan=lifespan,
                  telemetry={"operation_spans": False, "logs": False})
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    for unavailable in UNAVAILABLE:
        app.add_exception_handler(unavailable, unavailable_handler)
    app.add_exception_handler(ClientDisconnect, client_gone_handler)
    app.add_exception_handler(Exception, unexpected_error_handler)
    app.add_middleware(BodySizeLimit, limit=settings.max_body_bytes)
    # Outermost of the two: the caller is known before the size check reads the body.
    app.add_middleware(AuthenticateFirst)
    # Outermost: counts every answer, those of the other two included.
    app.add_middleware(RequestMetrics)
    app.include_router(router)
    app.include_router(audit.router)

    @app.get("/asyncapi.json", include_in_schema=False)
    async def asyncapi() -> Response:
        """The bus contract, beside /openapi.json: made on the first request, so the API
        does not import FastStream (which writes it) to start."""
        from steno.services.common.bus_contract import rendered_document

        document = await asyncio.to_thread(rendered_document, settings.namespace)
        return Response(document, media_type="application/json")

    app.router.routes.insert(0, create_fast_path())
    return app
