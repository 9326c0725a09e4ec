"""The HTTP front: ``/v1/responses`` (create, retrieve, stream) with the SSE edge inside."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

import orjson
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from schemas.api import CreateResponseRequest
from schemas.events import LoggedEvent
from schemas.fold import fold
from schemas.ids import new_response_id
from services.api.errors import (
    ApiError,
    api_error_handler,
    http_error_handler,
    unexpected_error_handler,
    validation_error_handler,
)
from services.api.render import InvalidInput
from services.api.response_plan import plan_response
from services.api.store import ResponseStore
from services.common import bus, db
from services.common.config import Settings
from services.common.harmony_vocab import harmony_encoding
from services.edge import SSE_HEADERS, EventReader, ResponseTail, frame

log = logging.getLogger(__name__)

# Until API keys exist every request belongs to one tenant.
DEFAULT_TENANT = "default"


class Services:
    """What the routes share, opened in the app's lifespan."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.names = bus.Names(settings.namespace, settings.token_partitions)

    async def open(self) -> None:
        self.encoding = await asyncio.to_thread(harmony_encoding)
        self.nc = await bus.connect(self.settings.nats_url, "steno-api")
        self.js = self.nc.jetstream()
        await bus.ensure_streams(self.js, self.names)
        self.pool = await db.create_pool(self.settings.database_url, max_size=20)
        self.store = ResponseStore(self.pool)
        self.reader = EventReader(self.pool)
        self.tail = ResponseTail(self.nc, self.reader, self.names.events_subject)

    async def close(self) -> None:
        await self.nc.close()
        await self.pool.close()


def _sse(events: AsyncIterator[LoggedEvent]) -> StreamingResponse:
    async def frames() -> AsyncIterator[bytes]:
        async for event in events:
            yield frame(event)

    return StreamingResponse(frames(), media_type="text/event-stream", headers=SSE_HEADERS)


def _json(body: dict) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


def create_app(settings: Settings | None = None) -> FastAPI:
    services = Services(settings or Settings.from_env())

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await services.open()
        try:
            yield
        finally:
            await services.close()

    app = FastAPI(title="Steno", version="0.1.0", lifespan=lifespan)
    app.add_exception_handler(ApiError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.add_exception_handler(Exception, unexpected_error_handler)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/v1/responses")
    async def create_response(body: CreateResponseRequest) -> Response:
        response_id = new_response_id()
        try:
            plan = plan_response(body, response_id, DEFAULT_TENANT, int(time.time()), services.encoding)
        except InvalidInput as exc:
            raise ApiError(400, str(exc), param=exc.param, code="invalid_value") from exc
        await services.store.create(plan.record, plan.first_events)
        try:
            await services.js.publish(
                services.names.gen_subject(body.model),
                plan.generation.model_dump_json().encode(),
                headers={"Nats-Msg-Id": response_id},
            )
        except Exception as exc:
            log.exception("publishing %s failed", response_id)
            await _fail_unpublished(plan.record.base_snapshot, response_id)
            raise ApiError(503, "The generation queue is unavailable; retry later.") from exc
        if body.stream:
            return _sse(services.tail.events(response_id, after=-1))
        if body.background:
            return _json(plan.record.base_snapshot)
        async for event in services.tail.events(response_id, after=0):
            if event.is_terminal:
                return _json(orjson.loads(event.payload)["response"])
        raise ApiError(500, "The response ended without a terminal event.")

    async def _fail_unpublished(snapshot: dict, response_id: str) -> None:
        message = "The generation queue was unavailable."
        failed = {**snapshot, "status": "failed", "error": {"code": "server_error", "message": message}}
        error = {"type": "error", "sequence_number": 1, "code": "server_error", "message": message, "param": None}
        terminal = {"type": "response.failed", "sequence_number": 2, "response": failed}
        events = [
            LoggedEvent(seq=1, type="error", payload=orjson.dumps(error).decode()),
            LoggedEvent(seq=2, type="response.failed", payload=orjson.dumps(terminal).decode()),
        ]
        await services.store.fail_unstarted(response_id, events, failed)

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(
        request: Request,
        response_id: str,
        stream: bool = False,
        starting_after: int | None = Query(default=None),
    ) -> Response:
        stored = await services.store.get(response_id, DEFAULT_TENANT)
        if stored is None:
            raise ApiError(404, f"No response found with id '{response_id}'.", param="response_id")
        if stream:
            cursor = starting_after
            if cursor is None and request.headers.get("last-event-id"):
                try:
                    cursor = int(request.headers["last-event-id"])
                except ValueError:
                    raise ApiError(400, "Last-Event-ID must be an integer sequence number.") from None
            if cursor is not None and cursor < -1:
                raise ApiError(400, "starting_after must be -1 or greater.", param="starting_after")
            return _sse(services.tail.events(response_id, after=-1 if cursor is None else cursor))
        if stored.snapshot is not None:
            return _json(stored.snapshot)
        events = await services.reader.read_after(response_id, -1)
        folded = fold(orjson.loads(e.payload) for e in events)
        return _json(folded or stored.base_snapshot)

    return app
