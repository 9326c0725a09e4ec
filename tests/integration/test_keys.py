"""Resolving API keys against the real key table: what costs a query and what does not."""

import asyncio
import secrets

import asyncpg
import pytest

from steno.services.api.keys import KEY_PREFIX, KeyResolver, create_key
from steno.services.common.db import asyncpg_dsn

pytestmark = pytest.mark.integration


class CountingPool:
    """The real pool, counting the lookups that reach Postgres."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self.queries = 0

    async def fetchval(self, *args):
        self.queries += 1
        return await self._pool.fetchval(*args)


@pytest.fixture
async def pool(settings):
    created = await asyncpg.create_pool(asyncpg_dsn(settings.database_url), min_size=1, max_size=4)
    yield created
    await created.close()


def unknown_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


async def test_a_key_that_could_not_be_one_costs_no_query(pool):
    counting = CountingPool(pool)
    resolver = KeyResolver(counting)
    for key in ("sk-nope", "x" * 100_000, KEY_PREFIX + "short", KEY_PREFIX + "!" * 43):
        assert await resolver.tenant_for(key) is None
    assert counting.queries == 0


async def test_keys_are_remembered_known_and_unknown_and_unknown_ones_cannot_push_out_known_ones(pool):
    created = await create_key(pool, "cache-tenant")
    counting = CountingPool(pool)
    resolver = KeyResolver(counting, known=10, unknown=5)
    assert await resolver.tenant_for(created.key) == "cache-tenant"
    stranger = unknown_key()
    assert await resolver.tenant_for(stranger) is None
    assert await resolver.tenant_for(stranger) is None
    assert counting.queries == 2  # each looked up once
    for _ in range(50):  # a flood of unknown keys
        assert await resolver.tenant_for(unknown_key()) is None
    queries = counting.queries
    assert await resolver.tenant_for(created.key) == "cache-tenant"
    assert counting.queries == queries  # still remembered


async def test_concurrent_lookups_of_one_key_share_one_query(pool):
    created = await create_key(pool, "burst-tenant")
    counting = CountingPool(pool)
    resolver = KeyResolver(counting)
    tenants = await asyncio.gather(*(resolver.tenant_for(created.key) for _ in range(20)))
    assert tenants == ["burst-tenant"] * 20
    assert counting.queries == 1
