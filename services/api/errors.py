"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from nats.errors import Error as NatsError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          408: "invalid_request_error", 409: "invalid_request_error", 413: "invalid_request_error",
          422: "invalid_request_error", 429: "rate_limit_error", 431: "invalid_request_error",
          503: "service_unavailable_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str | None = None, headers: dict[str, str] | None = None) -> None:
        """``kind``: the error's ``type`` where the status alone does not decide it (a rate
        limit names the limit: ``requests`` or ``tokens``); ``headers`` go on the answer."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind
        self.headers = headers


def error_body(status: int, message: str, param: str | None = None, code: str | None = None,
               kind: str | None = None) -> dict[str, Any]:
    kind = kind or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _param_from_location(location: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in location if p not in ("body", "query", "path")]
    if not parts:
        return None
    param = parts[0]
    for part in parts[1:]:
        param += f"[{part}]" if part.isdigit() else f".{part}"
    return param


# Starlette calls each handler only for its exception class, and types them all as
# taking any exception.
async def api_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse(error_body(exc.status, exc.message, exc.param, exc.code, exc.kind), status_code=exc.status,
                        headers=exc.headers)


async def validation_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    param = _param_from_location(tuple(first.get("loc", ())))
    if first.get("type") == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    elif first.get("type") in ("json_invalid", "model_attributes_type"):
        message = "The request body is not valid JSON." if first.get("type") == "json_invalid" else (
            "The request body must be a JSON object."
        )
        param = None
    elif first.get("type") == "missing":
        message = f"Missing required parameter: '{param}'."
    else:
        message = f"Invalid value for '{param}': {first.get('msg', 'invalid')}."
    code = "unknown_parameter" if first.get("type") == "extra_forbidden" else (
        "missing_required_parameter" if first.get("type") == "missing" else "invalid_value"
    )
    return JSONResponse(error_body(400, message, param, code), status_code=400)


async def http_error_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return JSONResponse(error_body(exc.status_code, str(exc.detail)), status_code=exc.status_code)


# What a request fails with when Postgres or NATS cannot be reached: a 503 to retry.
UNAVAILABLE: tuple[type[Exception], ...] = (
    OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError, asyncpg.CannotConnectNowError, TimeoutError,
    NatsError,
)


def unavailable_response(exc: Exception) -> JSONResponse:
    log.warning("backing service unavailable: %s", exc)
    return JSONResponse(
        error_body(503, "The service is temporarily unavailable; retry shortly."),
        status_code=503,
        headers={"Retry-After": "1"},
    )


async def unavailable_handler(_: Request, exc: Exception) -> JSONResponse:
    return unavailable_response(exc)


async def client_gone_handler(_: Request, __: Exception) -> Response:
    """The client left before its body was read (or the body stalled): nobody to answer,
    and nothing went wrong here."""
    return Response(status_code=400)


async def unexpected_error_handler(_: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(error_body(500, "The server had an error while processing your request."), status_code=500)
