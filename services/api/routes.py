"""``/v1/responses`` and ``/v1/conversations`` over HTTP: each route reads the request,
calls the Responses service (``responses.py``) or the Conversations service
(``conversations.py``) as the caller's tenant, and writes what it returns."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steno.schemas.api import (
    CountInputTokensRequest,
    CreateConversationItemsRequest,
    CreateConversationRequest,
    CreateResponseRequest,
    UpdateConversationRequest,
)
from steno.services.api.conversations import ConversationsService
from steno.services.api.errors import ApiError, validation_error_handler
from steno.services.api.responses import EventStream, ResponsesService, check_include
from steno.services.common.metrics import exposition
from steno.services.edge import EventStreamResponse

router = APIRouter()
_SEQUENCE_NUMBER = re.compile(r"^[0-9]{1,18}$")


# Dependencies are coroutines: FastAPI runs plain functions in a thread pool, a thread
# hop per request.
async def responses_service(request: Request) -> ResponsesService:
    service: ResponsesService = request.app.state.api.responses
    return service


async def conversations_service(request: Request) -> ConversationsService:
    service: ConversationsService = request.app.state.api.conversations
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


@dataclass(frozen=True)
class ListQuery:
    """A list's page, as OpenAI's list routes take it."""

    after: str | None
    limit: int
    descending: bool


async def list_query(
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
) -> ListQuery:
    return ListQuery(after, limit, descending=order == "desc")


Service = Annotated[ResponsesService, Depends(responses_service)]
Conversations = Annotated[ConversationsService, Depends(conversations_service)]
Tenant = Annotated[str, Depends(tenant_of)]
Includes = Annotated[list[str], Depends(query_includes)]
Page = Annotated[ListQuery, Depends(list_query)]


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _answer(result: EventStream | dict[str, Any]) -> Response:
    if isinstance(result, EventStream):
        return EventStreamResponse(result.chunks)
    return _json(result)


@router.get("/health", include_in_schema=False)
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "alive"}


@router.get("/readyz", include_in_schema=False)
async def readyz(request: Request) -> Response:
    """Readiness: every check of ``services/common/health.py`` this service runs."""
    ready, report = await request.app.state.api.readiness.evaluate()
    return _json(report, 200 if ready else 503)


@router.get("/metrics", include_in_schema=False)
async def metrics() -> Response:
    body, content_type = exposition()
    return Response(body, media_type=content_type)


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
async def list_input_items(response_id: str, service: Service, tenant: Tenant, include: Includes,
                           query: Page) -> Response:
    page = await service.input_items(response_id, tenant, query.after, query.limit, descending=query.descending)
    return _json({
        "object": "list",
        "data": page.items,
        "first_id": page.items[0]["id"] if page.items else None,
        "last_id": page.items[-1]["id"] if page.items else None,
        "has_more": page.has_more,
    })


@router.post("/v1/conversations")
async def create_conversation(service: Conversations, tenant: Tenant,
                              body: CreateConversationRequest | None = None) -> Response:
    return _json(await service.create(body or CreateConversationRequest(), tenant))


@router.get("/v1/conversations/{conversation_id}")
async def retrieve_conversation(conversation_id: str, service: Conversations, tenant: Tenant) -> Response:
    return _json(await service.retrieve(conversation_id, tenant))


@router.post("/v1/conversations/{conversation_id}")
async def update_conversation(conversation_id: str, body: UpdateConversationRequest, service: Conversations,
                              tenant: Tenant) -> Response:
    return _json(await service.update(conversation_id, body, tenant))


@router.delete("/v1/conversations/{conversation_id}")
async def delete_conversation(conversation_id: str, service: Conversations, tenant: Tenant) -> Response:
    return _json(await service.delete(conversation_id, tenant))


@router.post("/v1/conversations/{conversation_id}/items")
async def create_conversation_items(conversation_id: str, body: CreateConversationItemsRequest,
                                    service: Conversations, tenant: Tenant, include: Includes) -> Response:
    return _json(await service.add_items(conversation_id, body, tenant))


@router.get("/v1/conversations/{conversation_id}/items")
async def list_conversation_items(conversation_id: str, service: Conversations, tenant: Tenant, include: Includes,
                                  query: Page) -> Response:
    return _json(await service.list_items(conversation_id, tenant, query.after, query.limit,
                                          descending=query.descending))


@router.get("/v1/conversations/{conversation_id}/items/{item_id}")
async def retrieve_conversation_item(conversation_id: str, item_id: str, service: Conversations, tenant: Tenant,
                                     include: Includes) -> Response:
    return _json(await service.item(conversation_id, item_id, tenant))


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}")
async def delete_conversation_item(conversation_id: str, item_id: str, service: Conversations,
                                   tenant: Tenant) -> Response:
    return _json(await service.delete_item(conversation_id, item_id, tenant))


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
