"""``/v1/responses`` over HTTP: each route reads the request, calls the Responses
service (``responses.py``) as the caller's tenant, and writes what it returns."""

from __future__ import annotations

import re
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steno.schemas.api import CountInputTokensRequest, CreateResponseRequest
from steno.services.api.errors import ApiError, validation_error_handler
from steno.services.api.responses import EventStream, ResponsesService, check_include
from steno.services.edge import EventStreamResponse

router = APIRouter()
_SEQUENCE_NUMBER = re.compile(r"^[0-9]{1,18}$")


# Dependencies are coroutines: FastAPI runs plain functions in a thread pool, a thread
# hop per request.
async def responses_service(request: Request) -> ResponsesService:
    service: ResponsesService = request.app.state.api.responses
    return service


async def tenant_of(request: Request) -> str:
    """Resolved before the request reached the route (``auth.AuthenticateFirst``)."""
    tenant: str = request.state.tenant
    return tenant


async def query_includes(
    include: Annotated[list[str] | None, Query(alias="include[]")] = None,
    include_plain: Annotated[list[str] | None, Query(alias="include")] = None,
) -> list[str]:
    """``include`` as clients send it (``include[]=…`` or ``include=…``), checked."""
    values = (include or []) + (include_plain or [])
    check_include(values)
    return values


Service = Annotated[ResponsesService, Depends(responses_service)]
Tenant = Annotated[str, Depends(tenant_of)]
Includes = Annotated[list[str], Depends(query_includes)]


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _answer(result: EventStream | dict[str, Any]) -> Response:
    if isinstance(result, EventStream):
        return EventStreamResponse(result.chunks)
    return _json(result)


@router.get("/health", include_in_schema=False)
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.post("/v1/responses")
async def create_response(body: CreateResponseRequest, service: Service, tenant: Tenant) -> Response:
    return _answer(await service.create(body, tenant))


@router.post("/v1/responses/input_tokens")
async def count_input_tokens(body: CountInputTokensRequest, service: Service, tenant: Tenant) -> Response:
    return _json(await service.count_input_tokens(body, tenant))


@router.get("/v1/models")
async def list_models(service: Service, tenant: Tenant) -> Response:
    return _json(service.models())


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, service: Service, tenant: Tenant) -> Response:
    return _json(await service.model(model_id))


@router.get("/v1/responses/{response_id}")
async def retrieve_response(
    response_id: str,
    service: Service,
    tenant: Tenant,
    include: Includes,
    stream: bool = False,
    starting_after: int | None = None,
    include_obfuscation: bool | None = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    if not stream:
        return _json(await service.retrieve(response_id, tenant))
    cursor = starting_after
    if cursor is None and last_event_id:
        if not _SEQUENCE_NUMBER.match(last_event_id):  # int() would also take "1_0" and " 7"
            raise ApiError(400, "Last-Event-ID must be a sequence number.", param="Last-Event-ID")
        cursor = int(last_event_id)
    return _answer(await service.stream(response_id, tenant, cursor))


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, service: Service, tenant: Tenant) -> Response:
    return _json(await service.cancel(response_id, tenant))


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, service: Service, tenant: Tenant) -> Response:
    return _json(await service.delete(response_id, tenant))


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    service: Service,
    tenant: Tenant,
    include: Includes,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
) -> Response:
    page = await service.input_items(response_id, tenant, after, limit, descending=order == "desc")
    return _json({
        "object": "list",
        "data": page.items,
        "first_id": page.items[0]["id"] if page.items else None,
        "last_id": page.items[-1]["id"] if page.items else None,
        "has_more": page.has_more,
    })


class CreateFastPath:
    """``POST /v1/responses`` with a JSON body that validates, straight to
    ``create_response``, skipping FastAPI's request handling (content negotiation,
    parsing the body into Python objects and then validating those, solving
    dependencies): in a burst every request's intake comes before anything else, and
    that handling was a large part of it (docs/performance.md). Every other request
    goes to the declared route, which stays the one source of its errors and of the
    OpenAPI document; both run ``create_response``."""

    def __init__(self, declared: ASGIApp) -> None:
        self._declared = declared

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        if not _is_json(request.headers.get("content-type", "")):
            return await self._declared(scope, receive, send)
        body = await request.body()
        try:
            parsed = CreateResponseRequest.model_validate_json(body)
        except ValidationError as invalid:
            errors = invalid.errors(include_input=False)
            if any(error["type"] == "json_invalid" for error in errors):
                # FastAPI's own parser takes JSON this one refuses (unpaired surrogates,
                # nesting without limit): such a body must not reach the declared route.
                answer = await validation_error_handler(request, RequestValidationError(errors))
                return await answer(scope, receive, send)
            return await self._declared(scope, _replaying(body, receive), send)
        response = await create_response(parsed, await responses_service(request), await tenant_of(request))
        await response(scope, receive, send)


def _is_json(content_type: str) -> bool:
    """What FastAPI parses as JSON: no content type, ``application/json`` or ``application/*+json``."""
    media = content_type.partition(";")[0].strip().lower()
    return not media or media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


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
                    and route.path == "/v1/responses" and "POST" in (route.methods or ()))
    return Route("/v1/responses", CreateFastPath(declared.app), methods=["POST"], include_in_schema=False)
