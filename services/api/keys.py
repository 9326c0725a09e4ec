"""API keys: created and revoked from the ``steno keys`` command, stored hashed, each
bound to a tenant. The API resolves a bearer key to its tenant."""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

import asyncpg

KEY_PREFIX = "sk-steno-"
_KEY = re.compile(rf"^{re.escape(KEY_PREFIX)}[A-Za-z0-9_-]{{43}}$")
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


def well_formed(key: str) -> bool:
    """Whether ``key`` could be a key ``create_key`` made (anything else needs no lookup)."""
    return bool(_KEY.match(key))


class _Recent:
    """The latest answers for the most recently used keys, each good for CACHE_TTL_S."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._answers: OrderedDict[str, tuple[float, str | None]] = OrderedDict()

    def get(self, digest: str, now: float) -> tuple[float, str | None] | None:
        answer = self._answers.get(digest)
        if answer is None or now - answer[0] >= CACHE_TTL_S:
            return None
        self._answers.move_to_end(digest)
        return answer

    def put(self, digest: str, now: float, tenant: str | None) -> None:
        self._answers[digest] = (now, tenant)
        self._answers.move_to_end(digest)
        if len(self._answers) > self._size:
            self._answers.popitem(last=False)


class KeyResolver:
    """Bearer key -> tenant, with a short cache so a request costs no query. Unknown keys
    are remembered too, in a smaller cache of their own, so that a flood of them cannot
    push out the keys in use; a key that could not be one is refused without a query,
    and concurrent lookups of one key share a query."""

    def __init__(self, pool: asyncpg.Pool, known: int = 10_000, unknown: int = 1_000) -> None:
        self._pool = pool
        self._known = _Recent(known)
        self._unknown = _Recent(unknown)
        self._looking_up: dict[str, asyncio.Future[str | None]] = {}

    async def tenant_for(self, key: str) -> str | None:
        if not well_formed(key):
            return None
        digest = hash_key(key)
        now = time.monotonic()
        answer = self._known.get(digest, now) or self._unknown.get(digest, now)
        if answer is not None:
            return answer[1]
        pending = self._looking_up.get(digest)
        if pending is not None:
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                if pending.cancelled():  # the lookup we waited for was abandoned, not this request
                    return await self.tenant_for(key)
                raise
        pending = asyncio.get_running_loop().create_future()
        self._looking_up[digest] = pending
        try:
            tenant: str | None = await self._pool.fetchval(
                "SELECT tenant_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL", digest
            )
        except Exception as exc:
            pending.set_exception(exc)
            pending.exception()  # retrieved: a lookup nobody shared is not an unhandled error
            raise
        except BaseException:
            pending.cancel()
            raise
        finally:
            del self._looking_up[digest]
        (self._known if tenant is not None else self._unknown).put(digest, now, tenant)
        pending.set_result(tenant)
        return tenant
