"""Per-tenant quotas: requests per minute, concurrent generations, tokens per minute.

A request is admitted or refused with a 429 before anything of it is stored or
published. The decision (``decide``) is pure; ``QuotaGate`` reads and counts in Postgres
(migration 0011), and the ``steno tenants`` command sets the limits.

Windows are fixed minutes since the epoch, on the database's clock, so every replica
agrees on them. A window counts the requests admitted in it, their prompt tokens, and
the output tokens of the responses that ended in it; a window at or over a limit
refuses until the next minute begins. Running generations are the tenant's responses
still queued or in progress."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Literal

import asyncpg

from steno.services.api.errors import ApiError

MINUTE_S = 60
# A quota change reaches every API replica within this many seconds: each reads the whole
# (small) table that often, so a tenant without a quota costs no query per request.
CACHE_TTL_S = 5.0
# How long an admitted request whose response is not stored yet counts as running: the
# store follows admission at once, and a request that failed in between stops counting.
ADMISSION_TTL_S = 10
# A running generation's end cannot be foreseen: the client is told to retry this soon.
CONCURRENCY_RETRY_S = 1


@dataclass(frozen=True)
class Quota:
    """A tenant's limits; None is unlimited."""

    requests_per_minute: int | None = None
    concurrent_generations: int | None = None
    tokens_per_minute: int | None = None


@dataclass(frozen=True)
class Usage:
    """What the tenant used in the current window, and its generations running now."""

    requests: int
    tokens: int
    running: int


@dataclass(frozen=True)
class Refusal:
    kind: Literal["requests", "tokens"]
    message: str
    retry_after_s: int


def window_of(now: float) -> int:
    """The minute (since the epoch) that ``now`` (epoch seconds) falls in."""
    return math.floor(now / MINUTE_S)


def seconds_to_next_window(now: float) -> int:
    """Whole seconds until the next window begins, at least one (as ``Retry-After``)."""
    return max(1, math.ceil((window_of(now) + 1) * MINUTE_S - now))


def decide(quota: Quota, usage: Usage, now: float) -> Refusal | None:
    """None admits the request. Otherwise the first limit reached, in the order requests,
    tokens, concurrency (a used-up window outlasts a running generation's wait)."""
    retry = seconds_to_next_window(now)
    if quota.requests_per_minute is not None and usage.requests >= quota.requests_per_minute:
        return Refusal("requests", f"Rate limit reached for requests per minute (RPM): Limit "
                       f"{quota.requests_per_minute}, Used {usage.requests}, Requested 1. Please try again in "
                       f"{retry}s.", retry)
    if quota.tokens_per_minute is not None and usage.tokens >= quota.tokens_per_minute:
        return Refusal("tokens", f"Rate limit reached for tokens per minute (TPM): Limit {quota.tokens_per_minute}, "
                       f"Used {usage.tokens}. Please try again in {retry}s.", retry)
    if quota.concurrent_generations is not None and usage.running >= quota.concurrent_generations:
        return Refusal("requests", f"Too many concurrent generations: Limit {quota.concurrent_generations}, "
                       f"Running {usage.running}. Please try again when one has finished.", CONCURRENCY_RETRY_S)
    return None


def rate_limit_headers(quota: Quota, usage: Usage, refusal: Refusal, now: float) -> dict[str, str]:
    """The headers of a 429: ``Retry-After`` and OpenAI's ``x-ratelimit-*`` for each
    per-minute limit the tenant has."""
    reset = f"{seconds_to_next_window(now)}s"
    headers = {"Retry-After": str(refusal.retry_after_s)}
    for name, limit, used in (("requests", quota.requests_per_minute, usage.requests),
                              ("tokens", quota.tokens_per_minute, usage.tokens)):
        if limit is not None:
            headers[f"x-ratelimit-limit-{name}"] = str(limit)
            headers[f"x-ratelimit-remaining-{name}"] = str(max(0, limit - used))
            headers[f"x-ratelimit-reset-{name}"] = reset
    return headers


class QuotaGate:
    """Admits a tenant's requests within its quota, counted across API replicas.

    Counters live in Postgres, which every replica already shares and which holds the
    responses whose status says what is running. A tenant's admissions take a
    transaction-scoped advisory lock, then read the window and the running generations
    and write the new counts: read and write cannot interleave with another replica's,
    and the lock goes with the transaction, so a replica that dies holds nothing."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._quotas: dict[str, Quota] = {}
        self._loaded_at = -math.inf
        self._loading: asyncio.Task[None] | None = None

    async def admit(self, tenant: str, response_id: str, prompt_tokens: int) -> None:
        """Counts the request that will store ``response_id``, or raises a 429 (and counts
        nothing)."""
        quota = await self._quota_of(tenant)
        if quota is None:
            return
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('steno.quota/' || $1, 0))", tenant)
            row = await conn.fetchrow(_USAGE, tenant, ADMISSION_TTL_S)
            assert row is not None  # one row, from the clock
            now = row["now"]
            usage = Usage(row["requests"], row["tokens"], row["running"])
            refusal = decide(quota, usage, now)
            if refusal is not None:
                raise ApiError(429, refusal.message, code="rate_limit_exceeded", kind=refusal.kind,
                               headers=rate_limit_headers(quota, usage, refusal, now))
            await conn.execute(_ADMIT, tenant, window_of(now), prompt_tokens, response_id, ADMISSION_TTL_S)

    async def _quota_of(self, tenant: str) -> Quota | None:
        if time.monotonic() - self._loaded_at >= CACHE_TTL_S:
            # Requests arriving while the table is read share the read.
            if self._loading is None or self._loading.done():
                self._loading = asyncio.create_task(self._load())
            await asyncio.shield(self._loading)
        return self._quotas.get(tenant)

    async def _load(self) -> None:
        self._quotas = {row[0]: Quota(row[1], row[2], row[3]) for row in await self._pool.fetch(
            "SELECT tenant_id, requests_per_minute, concurrent_generations, tokens_per_minute FROM tenant_quotas")}
        self._loaded_at = time.monotonic()


# The window's counts and the running generations, on the database's clock (read after
# the lock, hence clock_timestamp(): now() is the transaction's start).
_USAGE = """
WITH clock AS (SELECT extract(epoch FROM clock_timestamp())::float8 AS now)
SELECT clock.now,
       coalesce(w.requests, 0) AS requests,
       coalesce(w.tokens, 0) AS tokens,
       (SELECT count(*) FROM responses WHERE tenant_id = $1 AND status IN ('queued', 'in_progress'))
       + (SELECT count(*) FROM quota_admissions AS a
          WHERE a.tenant_id = $1 AND a.admitted_at > clock_timestamp() - make_interval(secs => $2)
            AND NOT EXISTS (SELECT 1 FROM responses AS r WHERE r.id = a.response_id)) AS running
FROM clock LEFT JOIN quota_windows AS w ON w.tenant_id = $1 AND w.minute = floor(clock.now / 60)::bigint
"""

# Counts the request in its window, notes its admission, and drops what no longer counts:
# earlier windows, and admissions that are stored or expired.
_ADMIT = """
WITH earlier AS (
    DELETE FROM quota_windows WHERE tenant_id = $1 AND minute < $2
), settled AS (
    DELETE FROM quota_admissions AS a
    WHERE a.tenant_id = $1 AND (a.admitted_at <= clock_timestamp() - make_interval(secs => $5)
                                OR EXISTS (SELECT 1 FROM responses AS r WHERE r.id = a.response_id))
), admitted AS (
    INSERT INTO quota_admissions (response_id, tenant_id, admitted_at) VALUES ($4, $1, clock_timestamp())
)
INSERT INTO quota_windows (tenant_id, minute, requests, tokens) VALUES ($1, $2, 1, $3)
ON CONFLICT (tenant_id, minute) DO UPDATE
SET requests = quota_windows.requests + 1, tokens = quota_windows.tokens + excluded.tokens
"""

