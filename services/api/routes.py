"""``/v1/responses`` routes. Every lookup is scoped to the caller's tenant: another
tenant's response is a 404, the same as a missing one."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Annotated, Any, get_args

import orjson
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from openai.types.responses import ResponseIncludable
from pydantic import ValidationError
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steno.schemas.api import CreateResponseRequest
from steno.schemas.bus import CancelOrder
from steno.schemas.events import LoggedEvent
from steno.schemas.fold import fold
from steno.schemas.ids import new_response_id
from steno.services.api.errors import ApiError
from steno.services.api.render import InvalidInput
from steno.services.api.response_plan import history_items, plan_response
from steno.services.api.store import StoredResponse
from steno.services.common.bus import model_token
from steno.services.edge import KEEPALIVE_S, EventStreamResponse, LiveEvents, sse_body

log = logging.getLogger(__name__)

router = APIRouter()
INCLUDABLE = frozenset(get_args(ResponseIncludable))
# How long POST /cancel waits for the terminal event before answering with the snapshot as it stands.
CANCEL_WAIT_S = 10.0


# Dependencies are coroutines: FastAPI runs plain functions in a thread pool, a thread
# hop per request.
async def services_of(request: Request):
    return request.app.state.services


async def tenant_of(request: Request) -> str:
    return await request.app.state.services.authenticate(request)


async def query_includes(
    include: Annotated[list[str] | None, Query(alias="include[]")] = None,
    include_plain: Annotated[list[str] | None, Query(alias="include")] = None,
) -> list[str]:
    """``include`` as clients send it (``include[]=…`` or ``include=…``), checked."""
    values = (include or []) + (include_plain or [])
    _check_include(values)
    return values


Services = Annotated[Any, Depends(services_of)]
Tenant = Annotated[str, Depends(tenant_of)]
Includes = Annotated[list[str], Depends(query_includes)]


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"No response found with id '{response_id}'.", param="response_id")


async def _owned(services, response_id: str, tenant: str) -> StoredResponse:
    """The caller's stored response, or the same 404 whether it is missing or another tenant's."""
    stored = await services.store.get(response_id, tenant)
    if stored is None:
        raise _not_found(response_id)
    return stored


def _check_include(include: list[str] | None, param: str = "include") -> None:
    for index, value in enumerate(include or []):
        if value not in INCLUDABLE:
            raise ApiError(400, f"Unsupported include value {value!r}.", param=f"{param}[{index}]", code="invalid_value")


def _failure_events(snapshot: dict[str, Any]):
    """The events that end a stream the edge could not finish (not part of the log)."""

    def events(last_seq: int) -> list[LoggedEvent]:
        message = "The stream was interrupted; resume it with starting_after set to the last sequence number received."
        failed = {**snapshot, "status": "failed", "error": {"code": "server_error", "message": message}}
        error = {"type": "error", "sequence_number": last_seq + 1, "code": "stream_interrupted",
                 "message": message, "param": None}
        terminal = {"type": "response.failed", "sequence_number": last_seq + 2, "response": failed}
        return [
            LoggedEvent(seq=last_seq + 1, type="error", payload=orjson.dumps(error).decode()),
            LoggedEvent(seq=last_seq + 2, type="response.failed", payload=orjson.dumps(terminal).decode()),
        ]

    return events


def _stream(services, response_id: str, after: int, snapshot: dict[str, Any], live: LiveEvents | None = None,
            known: list[LoggedEvent] | None = None) -> EventStreamResponse:
    runs = services.tail.runs(response_id, after=after, live=live, known=known, keepalive_s=KEEPALIVE_S)
    return EventStreamResponse(sse_body(runs, _failure_events(snapshot)))


async def _await_terminal(services, response_id: str, timeout_s: float | None = None) -> dict[str, Any] | None:
    async def wait() -> dict[str, Any] | None:
        async for event in services.tail.events(response_id, after=-1):
            if event.is_terminal:
                return orjson.loads(event.payload)["response"]
        return None

    try:
        return await asyncio.wait_for(wait(), timeout_s)
    except asyncio.TimeoutError:
        return None


async def _model_is_served(services, model: str) -> bool:
    """A live worker registered the model: the in-memory copy of the registry says so,
    or else the registry itself (the copy may lag); otherwise wait up to
    ``model_wait_s`` for a worker to register."""
    key = model_token(model)
    workers = services.workers
    if key in workers or await workers.confirm(key):
        return True
    return await workers.wait_for(lambda: key in workers, services.settings.model_wait_s) or await workers.confirm(key)


async def _history(services, request: CreateResponseRequest, tenant: str) -> list[dict[str, Any]]:
    if request.previous_response_id is None:
        return []
    chain = await services.store.conversation_before(request.previous_response_id, tenant)
    if not chain or chain[-1].response_id != request.previous_response_id:
        raise ApiError(400, f"Previous response with id '{request.previous_response_id}' not found.",
                       param="previous_response_id", code="previous_response_not_found")
    if not chain[-1].finished:
        raise ApiError(400, f"Previous response '{request.previous_response_id}' has not finished yet.",
                       param="previous_response_id", code="previous_response_in_progress")
    inputs = await services.store.input_items_of([turn.response_id for turn in chain])
    return history_items(chain, inputs)


@router.get("/health", include_in_schema=False)
async def health() -> dict:
    return {"status": "ok"}


@router.post("/v1/responses")
async def create_response(body: CreateResponseRequest, services: Services, tenant: Tenant) -> Response:
    if body.background and not body.store:
        raise ApiError(400, "Background responses must be stored (store=true).", param="store", code="invalid_value")
    _check_include(body.include)
    history = await _history(services, body, tenant)
    if not await _model_is_served(services, body.model):
        raise ApiError(404, f"The model '{body.model}' does not exist or no worker serves it.",
                       param="model", code="model_not_found")
    response_id = new_response_id(services.origin)
    try:
        plan = plan_response(body, response_id, tenant, int(time.time()), services.encoding, history)
    except InvalidInput as exc:
        raise ApiError(400, str(exc), param=exc.param, code="invalid_value") from exc
    await services.store.create(plan.record, plan.first_events)
    # A stream listens before the work is queued, so it starts from the events just
    # stored without reading them back.
    live = await services.tail.listen(response_id) if body.stream else None
    try:
        await services.js.publish(
            services.names.gen_subject(body.model),
            plan.generation.model_dump_json().encode(),
            headers={"Nats-Msg-Id": response_id},
        )
    except Exception as exc:
        log.exception("publishing %s failed", response_id)
        if live is not None:
            await live.close()
        await _fail_unpublished(services, plan.record.base_snapshot)
        raise ApiError(503, "The generation queue is unavailable; retry shortly.") from exc
    if live is not None:
        return _stream(services, response_id, -1, plan.record.base_snapshot, live=live, known=plan.first_events)
    if body.background:
        return _json(plan.record.base_snapshot)
    final = await _await_terminal(services, response_id)
    if final is None:
        raise ApiError(500, "The response ended without a terminal event.")
    return _json(final)


async def _fail_unpublished(services, snapshot: dict[str, Any]) -> None:
    message = "The generation queue was unavailable."
    failed = {**snapshot, "status": "failed", "error": {"code": "server_error", "message": message}}
    error = {"type": "error", "sequence_number": 1, "code": "server_error", "message": message, "param": None}
    terminal = {"type": "response.failed", "sequence_number": 2, "response": failed}
    events = [
        LoggedEvent(seq=1, type="error", payload=orjson.dumps(error).decode()),
        LoggedEvent(seq=2, type="response.failed", payload=orjson.dumps(terminal).decode()),
    ]
    await services.store.fail_unstarted(snapshot["id"], events, failed)


async def _current_snapshot(services, stored: StoredResponse) -> dict[str, Any]:
    if stored.snapshot is not None:
        return stored.snapshot
    events = await services.reader.read_after(stored.response_id, -1)
    return fold(orjson.loads(e.payload) for e in events) or stored.base_snapshot


@router.get("/v1/responses/{response_id}")
async def retrieve_response(
    response_id: str,
    services: Services,
    tenant: Tenant,
    stream: bool = False,
    starting_after: int | None = None,
    include: Includes = (),
    include_obfuscation: bool | None = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    stored = await _owned(services, response_id, tenant)
    if not stream:
        return _json(await _current_snapshot(services, stored))
    cursor = starting_after
    if cursor is None and last_event_id:
        try:
            cursor = int(last_event_id)
        except ValueError:
            raise ApiError(400, "Last-Event-ID must be a sequence number.", param="Last-Event-ID") from None
    if cursor is not None:
        if cursor < 0:
            raise ApiError(400, "starting_after must be a sequence number (0 or more).", param="starting_after")
        last = await services.store.last_seq(response_id)
        if cursor > last or (stored.finished and cursor >= last):
            raise ApiError(400, f"starting_after={cursor} is beyond the end of the stream (last event {last}).",
                           param="starting_after")
    return _stream(services, response_id, -1 if cursor is None else cursor, stored.base_snapshot)


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, services: Services, tenant: Tenant) -> Response:
    stored = await _owned(services, response_id, tenant)
    if not stored.background:
        raise ApiError(400, "Only responses created with background=true can be cancelled.", param="response_id")
    if stored.status == "cancelled":
        return _json(stored.snapshot)
    if stored.finished:
        raise ApiError(400, f"Cannot cancel a response whose status is '{stored.status}'.", param="response_id")
    await _order_cancel(services, response_id)
    final = await _await_terminal(services, response_id, CANCEL_WAIT_S)
    if final is not None:
        return _json(final)
    refreshed = await services.store.get(response_id, tenant)
    return _json(await _current_snapshot(services, refreshed or stored))


async def _order_cancel(services, response_id: str) -> None:
    await services.store.request_cancel(response_id)
    # Every worker watches the flags: the one generating the response aborts it, and
    # whichever picks it up later ends it at once.
    order = CancelOrder(response_id=response_id).model_dump_json().encode()
    await services.cancel_flags.put(response_id, order)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, services: Services, tenant: Tenant) -> Response:
    stored = await _owned(services, response_id, tenant)
    if not stored.finished:
        await _order_cancel(services, response_id)
    if not await services.store.delete(response_id, tenant):
        raise _not_found(response_id)  # deleted meanwhile
    return _json({"id": response_id, "object": "response.deleted", "deleted": True})


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    services: Services,
    tenant: Tenant,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
    include: Includes = (),
) -> Response:
    await _owned(services, response_id, tenant)
    page = await services.store.input_items_page(response_id, after, limit, descending=order == "desc")
    if page is None:
        raise ApiError(400, f"No input item with id '{after}' in this response.", param="after")
    return _json({
        "object": "list",
        "data": page.items,
        "first_id": page.items[0]["id"] if page.items else None,
        "last_id": page.items[-1]["id"] if page.items else None,
        "has_more": page.has_more,
    })


class CreateFastPath:
    """``POST /v1/responses`` with a JSON body that validates, straight to
    ``create_response``: FastAPI's request handling (content negotiation, parsing the
    body into Python objects and then validating those, solving dependencies) was a
    quarter of the API's CPU per streamed response (``steno bench``), and in a burst
    every request's intake comes before anything else. Every other request goes to the
    declared route, which stays the one source of its errors and of the OpenAPI document."""

    def __init__(self, declared: ASGIApp) -> None:
        self._declared = declared

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        if request.headers.get("content-type", "").partition(";")[0].strip().lower() != "application/json":
            return await self._declared(scope, receive, send)
        body = await request.body()
        try:
            parsed = CreateResponseRequest.model_validate_json(body)
        except ValidationError:
            return await self._declared(scope, _replaying(body, receive), send)
        services = scope["app"].state.services
        response = await create_response(parsed, services, await services.authenticate(request))
        await response(scope, receive, send)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """``receive`` for a request whose body was read already: the body, then what comes."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def create_fast_path() -> Route:
    declared = next(route for route in router.routes if isinstance(route, APIRoute)
                    and route.path == "/v1/responses" and "POST" in route.methods)
    return Route("/v1/responses", CreateFastPath(declared.app), methods=["POST"], include_in_schema=False)
