"""Session fixtures: real NATS and Postgres (found or embedded), a database and a bus
namespace of the session's own, and the service processes."""

from __future__ import annotations

import asyncio
import itertools
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import asyncpg
import openai
import pytest
from nats.aio.client import Client

from steno.infra.embedded import Infrastructure, resolve
from steno.infra.processes import Stack, remove_namespace
from steno.services.audit import verify_response
from steno.services.common import bus
from steno.services.common.config import ApiSettings
from steno.services.common.db import asyncpg_dsn
from steno.services.common.migrate import database_url_named, drop_database, ensure_database, upgrade

SLOW_MODEL = "steno-slow"
# A model with a context larger than the bus's largest message holds in prompt token ids.
LONG_MODEL = "steno-long"
LONG_CONTEXT_TOKENS = 400_000
# A model with a small context, for what happens when a conversation outgrows it.
SMALL_MODEL = "steno-small"
SMALL_CONTEXT_TOKENS = 600


@pytest.fixture(scope="session")
def infrastructure(tmp_path_factory) -> Infrastructure:
    infra = resolve(tmp_path_factory.mktemp("infra"))
    yield infra
    infra.stop()


@pytest.fixture(scope="session")
def settings(infrastructure) -> ApiSettings:
    run_id = secrets.token_hex(4)
    database_url = database_url_named(infrastructure.database_url, f"steno_test_{run_id}")
    asyncio.run(ensure_database(database_url))
    upgrade(database_url)
    settings_of_run = ApiSettings(
        nats_url=infrastructure.nats_url,
        database_url=database_url,
        namespace=f"t{run_id}",
        token_partitions=4,
        model_wait_s=1.0,
        # Long enough for any honest prompt of the tests, short enough to wait for.
        render_timeout_s=4.0,
    )
    yield settings_of_run

    remove_namespace(settings_of_run)

    asyncio.run(drop_database(database_url))


@pytest.fixture(scope="session")
def stack(settings, tmp_path_factory) -> Stack:
    running = Stack(settings, tmp_path_factory.mktemp("logs"))
    running.create_key("a")
    running.create_key("b")
    try:
        running.add("parser-0", "parser")
        running.add("worker-0", "worker", "--sim-tokens-per-s", "2000")
        # A slow model, for what must happen while a response is still generating.
        running.add("worker-slow", "worker", "--model", SLOW_MODEL, "--sim-tokens-per-s", "25")
        running.add("worker-long", "worker", "--model", LONG_MODEL, "--sim-tokens-per-s", "0",
                    "--sim-context-tokens", str(LONG_CONTEXT_TOKENS))
        running.add("worker-small", "worker", "--model", SMALL_MODEL, "--sim-tokens-per-s", "0",
                    "--sim-context-tokens", str(SMALL_CONTEXT_TOKENS))
        running.add_api()
        running.add_api()
        yield running
    except Exception:
        print(running.logs())
        raise
    finally:
        running.stop()


@pytest.fixture
async def db(settings):
    conn = await asyncpg.connect(asyncpg_dsn(settings.database_url))
    yield conn
    await conn.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and "stack" in item.fixturenames:
        running = item.funcargs.get("stack")
        if running is not None:
            report.sections.append(("service logs", running.logs()))


@pytest.fixture
def client(stack):
    """The SDK as tenant "a"."""
    import openai

    return openai.OpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0)


@pytest.fixture
def other_tenant(stack):
    """The SDK as tenant "b"."""
    import openai

    return openai.OpenAI(base_url=stack.base_url, api_key=stack.keys["b"], max_retries=0)


@contextmanager
def separate_stack(settings: ApiSettings, suffix: str, log_dir: Path) -> Iterator[Stack]:
    """A stack of its own in the namespace ``<the run's>suffix``, with a key for tenant
    "a": started by the caller, its logs printed if starting fails, stopped and its
    namespace removed afterwards."""
    stack = Stack(settings.with_changes(namespace=settings.namespace + suffix), log_dir)
    stack.create_key("a")
    try:
        yield stack
    except Exception:
        print(stack.logs())
        raise
    finally:
        stack.stop()
        remove_namespace(stack.settings)


def started_in_background(client: openai.OpenAI, model: str, prompt: str, timeout_s: float = 20):
    """A background response, once its output has begun (a worker is generating it)."""
    created = client.responses.create(model=model, input=prompt, background=True)
    deadline = time.monotonic() + timeout_s
    while not client.responses.retrieve(created.id).output:
        assert time.monotonic() < deadline, f"{created.id} never started"
        time.sleep(0.1)
    return created


def reparses_identically(settings: ApiSettings, response_id: str) -> bool:
    """What ``steno audit verify`` says: the response's stored tokens re-parse into its
    log, byte for byte, its snapshot is the fold of its log, and its hashes chain."""
    async def run() -> bool:
        pool = await asyncpg.create_pool(asyncpg_dsn(settings.database_url), min_size=1, max_size=2)
        try:
            verification = await verify_response(pool, response_id)
            assert verification is not None, f"no response {response_id}"
            assert verification.ok, verification.report()
            return verification.hashed
        finally:
            await pool.close()
    return asyncio.run(run())


@asynccontextmanager
async def namespace_of_its_own(settings: ApiSettings, suffix: str) -> AsyncIterator[tuple[bus.Names, Client]]:
    """A bus namespace with its streams, for a test that publishes there itself; its
    NATS connection, removed with the namespace afterwards."""
    names = bus.Names(settings.namespace + suffix, settings.token_partitions)
    nc = await bus.connect(settings, f"test-{suffix}")
    await bus.ensure_streams(nc.jetstream(), names)
    try:
        yield names, nc
    finally:
        await bus.remove_namespace(nc.jetstream(), names)
        await nc.close()


async def stepping_together_in_one_partition(client: openai.AsyncOpenAI, model: str, partitions: int,
                                             text: str) -> tuple[set[str], list[str]]:
    """Background responses started one after another until two share a token partition
    (by the pigeonhole, at most one more than there are partitions), then waited for: all
    their ids, and the pair. ``text`` is echoed back by a simulator: long enough, the
    responses all stream at once."""
    by_partition: dict[int, list[str]] = {}
    for n in itertools.count():
        created = await client.responses.create(model=model, input=f"{n} {text}", background=True)
        pair = by_partition.setdefault(bus.partition_of(created.id, partitions), [])
        pair.append(created.id)
        if len(pair) == 2:
            break
    started = {rid for ids in by_partition.values() for rid in ids}
    async with asyncio.timeout(120):
        for rid in started:
            while (await client.responses.retrieve(rid)).status in ("queued", "in_progress"):
                await asyncio.sleep(0.2)
    return started, pair


def steno_up_ready(log_path: Path, up: subprocess.Popen[bytes], timeout_s: float = 120) -> str:
    """What ``steno up`` (writing to ``log_path``) said by the time it was ready to serve."""
    deadline = time.monotonic() + timeout_s
    while "ready: base URL" not in log_path.read_text():
        assert up.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.2)
    return log_path.read_text()
