"""Per-tenant quotas, set with ``steno tenants``: a tenant over its quota gets OpenAI's
429 (``openai.RateLimitError``), and other tenants do not notice."""

import asyncio
import contextlib
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import asyncpg
import openai
import pytest

from steno.infra.processes import Stack, service_env
from steno.services.api.quotas import CACHE_TTL_S, MINUTE_S
from steno.services.common.db import asyncpg_dsn
from tests.conftest import SLOW_MODEL

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"


def steno_tenants(stack: Stack, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "steno.services.cli", "tenants", *args],
                          env=service_env(stack.settings), capture_output=True, text=True, check=check)


@contextlib.contextmanager
def tenant_with_quota(stack: Stack, *limits: str) -> Iterator[str]:
    """A tenant of its own with a key and these ``set-quota`` options, in force on every
    API replica and with most of a minute window ahead; its quota cleared afterwards."""
    tenant = f"quota-{secrets.token_hex(4)}"
    stack.create_key(tenant)
    steno_tenants(stack, "set-quota", "--tenant", tenant, *limits)
    try:
        time.sleep(CACHE_TTL_S)  # every replica has read the table again
        if time.time() % MINUTE_S > MINUTE_S - 20:  # not split by the next window
            time.sleep(MINUTE_S - time.time() % MINUTE_S)
        yield tenant
    finally:
        steno_tenants(stack, "clear-quota", "--tenant", tenant)


def sdk(stack: Stack, tenant: str, replica: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url_of(replica), api_key=stack.keys[tenant], max_retries=0)


def stored_responses(stack: Stack, tenant: str) -> int:
    async def count() -> int:
        conn = await asyncpg.connect(asyncpg_dsn(stack.settings.database_url))
        try:
            return await conn.fetchval("SELECT count(*) FROM responses WHERE tenant_id = $1", tenant)
        finally:
            await conn.close()
    return asyncio.run(count())


def outcome(client: openai.OpenAI, text: str) -> openai.RateLimitError | str:
    try:
        return client.responses.create(model=MODEL, input=text).status or ""
    except openai.RateLimitError as refused:
        return refused


def assert_rate_limited(refused: openai.RateLimitError, kind: str) -> None:
    assert refused.status_code == 429
    assert refused.code == "rate_limit_exceeded"
    assert refused.type == kind
    assert refused.param is None
    assert int(refused.response.headers["retry-after"]) >= 1


def test_burst_over_both_replicas_is_limited_in_total_and_other_tenants_are_unaffected(stack):
    with tenant_with_quota(stack, "--requests-per-minute", "4") as tenant:
        limited = [sdk(stack, tenant, replica) for replica in (0, 1)]
        other = [sdk(stack, "b", replica) for replica in (0, 1)]
        with ThreadPoolExecutor(8) as pool:
            mine = [pool.submit(outcome, limited[n % 2], f"burst {n}") for n in range(10)]
            theirs = [pool.submit(outcome, other[n % 2], f"neighbour {n}") for n in range(6)]
            mine_done, theirs_done = [f.result() for f in mine], [f.result() for f in theirs]

        assert theirs_done == ["completed"] * 6
        refusals = [r for r in mine_done if isinstance(r, openai.RateLimitError)]
        assert mine_done.count("completed") == 4 and len(refusals) == 6, mine_done
        for refused in refusals:
            assert_rate_limited(refused, "requests")
            assert "requests per minute" in refused.message
            assert refused.response.headers["x-ratelimit-limit-requests"] == "4"
            assert refused.response.headers["x-ratelimit-remaining-requests"] == "0"
        assert stored_responses(stack, tenant) == 4  # a refused request stored nothing


def test_a_second_generation_waits_for_the_first_under_a_concurrency_of_one(stack):
    with tenant_with_quota(stack, "--concurrent-generations", "1") as tenant:
        client = sdk(stack, tenant)
        running = client.responses.create(model=SLOW_MODEL, input="slow " * 200, background=True)
        try:
            with pytest.raises(openai.RateLimitError) as refused:
                client.responses.create(model=MODEL, input="meanwhile")
            assert_rate_limited(refused.value, "requests")
            assert "concurrent generations" in refused.value.message
            # The other replica counts the same generations.
            with pytest.raises(openai.RateLimitError):
                sdk(stack, tenant, 1).responses.create(model=MODEL, input="meanwhile")
        finally:
            assert client.responses.cancel(running.id).status == "cancelled"
        assert client.responses.create(model=MODEL, input="after it ended").status \
            == "completed"
        assert stored_responses(stack, tenant) == 2


def test_tokens_per_minute_count_prompt_and_output_tokens(stack):
    text = "count my tokens"
    probe_tenant = f"probe-{secrets.token_hex(4)}"
    stack.create_key(probe_tenant)
    probe = sdk(stack, probe_tenant).responses.create(model=MODEL, input=text)
    assert probe.usage is not None and probe.usage.output_tokens > 0
    # The prompt alone stays under the limit; with its output it reaches it.
    with tenant_with_quota(stack, "--tokens-per-minute", str(probe.usage.input_tokens + 1)) as tenant:
        client = sdk(stack, tenant)
        assert client.responses.create(model=MODEL, input=text).status == "completed"
        with pytest.raises(openai.RateLimitError) as refused:
            client.responses.create(model=MODEL, input=text)
        assert_rate_limited(refused.value, "tokens")
        assert refused.value.response.headers["x-ratelimit-remaining-tokens"] == "0"
        assert stored_responses(stack, tenant) == 1


def test_steno_tenants_sets_lists_and_clears_quotas(stack):
    tenant = f"cli-{secrets.token_hex(4)}"
    stack.create_key(tenant)
    assert f"{tenant}  keys=1  no quota" in steno_tenants(stack, "list").stdout

    set_out = steno_tenants(stack, "set-quota", "--tenant", tenant, "--requests-per-minute", "60",
                            "--tokens-per-minute", "1000").stdout
    assert f"tenant {tenant}: requests_per_minute=60  concurrent_generations=unlimited  tokens_per_minute=1000" \
        in set_out
    assert f"{tenant}  keys=1  requests_per_minute=60  concurrent_generations=unlimited  tokens_per_minute=1000" \
        in steno_tenants(stack, "list").stdout

    assert f"tenant {tenant}: no quota" in steno_tenants(stack, "clear-quota", "--tenant", tenant).stdout
    assert f"{tenant}  keys=1  no quota" in steno_tenants(stack, "list").stdout
    again = steno_tenants(stack, "clear-quota", "--tenant", tenant, check=False)
    assert again.returncode == 1 and f"no quota for tenant {tenant}" in again.stderr
    refused = steno_tenants(stack, "set-quota", "--tenant", tenant, "--requests-per-minute", "0", check=False)
    assert refused.returncode == 2 and "greater than 0" in refused.stderr
