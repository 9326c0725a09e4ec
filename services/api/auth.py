"""Who is calling: ``Authorization: Bearer <key>`` -> tenant."""

from __future__ import annotations

from fastapi import Request

from steno.services.api.errors import ApiError
from steno.services.api.keys import KeyResolver

# The tenant of every request when authentication is explicitly disabled (dev mode).
DEV_TENANT = "default"


class Authenticator:
    def __init__(self, resolver: KeyResolver | None) -> None:
        """``resolver`` None means authentication is disabled."""
        self._resolver = resolver

    async def __call__(self, request: Request) -> str:
        if self._resolver is None:
            return DEV_TENANT
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
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
