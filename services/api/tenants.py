"""``steno tenants``: each tenant's quota (``quotas.py``), set over ``STENO_DATABASE_URL``.
The API replicas apply a change within ``quotas.CACHE_TTL_S`` seconds."""

from __future__ import annotations

import argparse
import asyncio
import sys

import asyncpg

from steno.services.api.quotas import CACHE_TTL_S, Quota
from steno.services.common import db
from steno.services.common.config import Settings


async def set_quota(pool: asyncpg.Pool, tenant: str, quota: Quota) -> None:
    """Replaces ``tenant``'s limits (the ones not given are unlimited)."""
    await pool.execute(
        "INSERT INTO tenant_quotas (tenant_id, requests_per_minute, concurrent_generations, tokens_per_minute)"
        " VALUES ($1, $2, $3, $4) ON CONFLICT (tenant_id) DO UPDATE SET"
        " requests_per_minute = excluded.requests_per_minute,"
        " concurrent_generations = excluded.concurrent_generations,"
        " tokens_per_minute = excluded.tokens_per_minute, updated_at = now()",
        tenant, quota.requests_per_minute, quota.concurrent_generations, quota.tokens_per_minute,
    )


async def clear_quota(pool: asyncpg.Pool, tenant: str) -> bool:
    return await pool.execute("DELETE FROM tenant_quotas WHERE tenant_id = $1", tenant) != "DELETE 0"


async def list_tenants(pool: asyncpg.Pool) -> list[tuple[str, int, Quota | None]]:
    """Every tenant with an active key or a quota: its active keys and its quota."""
    rows = await pool.fetch(
        "SELECT t.tenant_id, (SELECT count(*) FROM api_keys AS k WHERE k.tenant_id = t.tenant_id"
        " AND k.revoked_at IS NULL), q.requests_per_minute, q.concurrent_generations, q.tokens_per_minute,"
        " q.tenant_id IS NOT NULL"
        " FROM (SELECT tenant_id FROM api_keys WHERE revoked_at IS NULL UNION SELECT tenant_id FROM tenant_quotas) AS t"
        " LEFT JOIN tenant_quotas AS q ON q.tenant_id = t.tenant_id ORDER BY 1")
    return [(row[0], row[1], Quota(row[2], row[3], row[4]) if row[5] else None) for row in rows]


def describe(quota: Quota | None) -> str:
    """A quota as ``steno tenants`` prints it."""
    if quota is None:
        return "no quota"
    return (f"requests_per_minute={_limit(quota.requests_per_minute)}  "
            f"concurrent_generations={_limit(quota.concurrent_generations)}  "
            f"tokens_per_minute={_limit(quota.tokens_per_minute)}")


def _limit(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit() and int(text) > 0):
        raise argparse.ArgumentTypeError("a whole number greater than 0")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    quota = actions.add_parser("set-quota", help="set a tenant's limits (those left out are unlimited)")
    quota.add_argument("--tenant", required=True)
    quota.add_argument("--requests-per-minute", type=_positive, metavar="N")
    quota.add_argument("--concurrent-generations", type=_positive, metavar="N")
    quota.add_argument("--tokens-per-minute", type=_positive, metavar="N")
    actions.add_parser("clear-quota", help="remove a tenant's limits").add_argument("--tenant", required=True)
    actions.add_parser("list", help="tenants with keys or quotas, and their quotas")


def run(args: argparse.Namespace) -> None:
    async def run_action() -> int:
        pool = await db.create_pool(Settings.from_env().database_url)
        try:
            if args.action == "set-quota":
                quota = Quota(args.requests_per_minute, args.concurrent_generations, args.tokens_per_minute)
                await set_quota(pool, args.tenant, quota)
                print(f"tenant {args.tenant}: {describe(quota)} (applies within {CACHE_TTL_S:.0f} s)")
            elif args.action == "clear-quota":
                if not await clear_quota(pool, args.tenant):
                    print(f"no quota for tenant {args.tenant}", file=sys.stderr)
                    return 1
                print(f"tenant {args.tenant}: no quota (applies within {CACHE_TTL_S:.0f} s)")
            else:
                for tenant, keys, tenant_quota in await list_tenants(pool):
                    print(f"{tenant}  keys={keys}  {describe(tenant_quota)}")
            return 0
        finally:
            await pool.close()

    sys.exit(asyncio.run(run_action()))
