"""API keys: created and revoked from the ``steno keys`` command, stored hashed, each
bound to a tenant. The API resolves a bearer key to its tenant."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

import asyncpg

KEY_PREFIX = "sk-steno-"
# A revoked key stops working within this many seconds on every API replica.
CACHE_TTL_S = 5.0


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class CreatedKey:
    key_id: str
    tenant_id: str
    key: str


async def create_key(pool: asyncpg.Pool, tenant_id: str, name: str = "") -> CreatedKey:
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    key_id = "key_" + secrets.token_hex(8)
    await pool.execute(
        "INSERT INTO api_keys (id, tenant_id, name, key_hash) VALUES ($1, $2, $3, $4)",
        key_id, tenant_id, name, hash_key(key),
    )
    return CreatedKey(key_id, tenant_id, key)


async def revoke_key(pool: asyncpg.Pool, key_id: str) -> bool:
    status = await pool.execute(
        "UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL", key_id
    )
    return status.endswith(" 1")


async def list_keys(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT id, tenant_id, name, created_at, revoked_at FROM api_keys ORDER BY created_at")


class KeyResolver:
    """Bearer key -> tenant, with a short cache so a request costs no query."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._cache: dict[str, tuple[float, str | None]] = {}

    async def tenant_for(self, key: str) -> str | None:
        digest = hash_key(key)
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and now - cached[0] < CACHE_TTL_S:
            return cached[1]
        tenant = await self._pool.fetchval(
            "SELECT tenant_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL", digest
        )
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[digest] = (now, tenant)
        return tenant
