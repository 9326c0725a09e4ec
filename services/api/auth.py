"""Who is calling: ``Authorization: Bearer <key>`` -> tenant, decided from the headers
before anything reads the request's body, so an unknown caller costs no body parsing."""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from steno.services.api.errors import UNAVAILABLE, ApiError, error_body, unavailable_response
from steno.services.api.keys import KeyResolver

# The tenant of every request when authentication is explicitly disabled (dev mode).
DEV_TENANT = "default"
# Routes under this prefix are the tenants' (health and the OpenAPI document are not).
PROTECTED_PREFIX = "/v1/"


class Authenticator:
    def __init__(self, resolver: KeyResolver | None) -> None:
        """``resolver`` None means authentication is disabled."""
        self._resolver = resolver

    async def __call__(self, authorization: str) -> str:
        """The tenant of an ``Authorization`` header's value; raises a 401."""
        if self._resolver is None:
            return DEV_TENANT
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(
                401,
                "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
                code="missing_api_key",
            )
        tenant = await self._resolver.tenant_for(key.strip())
        if tenant is None:
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
        return tenant


class AuthenticateFirst:
    """Resolves the caller of every tenant route before the route (or anything else)
    reads the body; the tenant is in ``request.state.tenant``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PROTECTED_PREFIX):
            return await self.app(scope, receive, send)
        authenticate: Authenticator = scope["app"].state.api.authenticate
        try:
            tenant = await authenticate(Headers(scope=scope).get("authorization", ""))
        except ApiError as refused:
            body = error_body(refused.status, refused.message, refused.param, refused.code)
            return await JSONResponse(body, status_code=refused.status)(scope, receive, send)
        except UNAVAILABLE as exc:
            return await unavailable_response(exc)(scope, receive, send)
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)
