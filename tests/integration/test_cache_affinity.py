"""prompt_cache_key as routing: the requests of one key meet the same worker of the model,
whose prefix cache then holds their prompt (the usage's cached_tokens says so), and a
key's shard moves to another worker when its worker dies or stops."""

import asyncio
import math
import signal
import time
from collections import Counter

import nats
import openai
import pytest
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NoKeysError

from steno.infra.processes import Stack
from steno.services.common.bus import Names, model_token
from steno.services.worker.prefix_cache import BLOCK_TOKENS
from tests.conftest import separate_stack

pytestmark = pytest.mark.integration

MODEL = "steno-affinity"
KEYS = [f"thread-{n}" for n in range(6)]


def worker(stack: Stack, name: str):
    return stack.add(name, "worker", "--model", MODEL, "--sim-tokens-per-s", "0")


def shard_holders(settings) -> dict[str, str]:
    """Each of the model's affinity shards (lease key) and the worker holding it."""
    async def read() -> dict[str, str]:
        nc = await nats.connect(settings.nats_url)
        try:
            names = Names.from_settings(settings)
            prefix = model_token(MODEL) + "."
            try:  # no bucket or no keys: no worker holds a shard yet
                bucket = await nc.jetstream().key_value(names.affinity_leases_bucket)
                keys = [key for key in await bucket.keys() if key.startswith(prefix)]
            except (BucketNotFoundError, NoKeysError):
                return {}
            holders = {}
            for key in keys:
                try:
                    holders[key] = (await bucket.get(key)).value.decode()
                except KeyNotFoundError:  # released between the listing and the read: no holder now
                    continue
            return holders
        finally:
            await nc.close()
    return asyncio.run(read())


def wait_for_holders(settings, count: int, timeout_s: float = 30.0) -> None:
    """Until ``count`` workers hold every shard, each its fair share: while the shares are
    uneven, shards still move (workers that started together may both claim more than
    their share at first), and a request of a moving shard meets a worker that has not
    seen its key."""
    shards = Names.from_settings(settings).affinity_shards
    deadline = time.monotonic() + timeout_s
    while True:
        holders = shard_holders(settings)
        held = Counter(holders.values())
        if len(holders) == shards and len(held) == count and max(held.values()) <= math.ceil(shards / count):
            return
        assert time.monotonic() < deadline, f"the shards did not settle on {count} workers: {holders}"
        time.sleep(0.5)


@pytest.fixture
def affinity_stack(settings, tmp_path):
    with separate_stack(settings, "affinity", tmp_path) as stack:
        stack.add("parser", "parser")
        stack.add_api()
        yield stack


def ask(client: openai.OpenAI, key: str) -> openai.types.responses.Response:
    # Long enough for several whole cache blocks.
    return client.responses.create(model=MODEL, input=f"the conversation of {key}, " * 12, prompt_cache_key=key,
                                   timeout=60)


def whole_blocks(tokens: int) -> int:
    return tokens // BLOCK_TOKENS * BLOCK_TOKENS


def test_every_request_of_a_key_after_the_first_finds_its_prompt_cached(affinity_stack):
    worker(affinity_stack, "worker-1")
    worker(affinity_stack, "worker-2")
    wait_for_holders(affinity_stack.settings, 2)
    client = openai.OpenAI(base_url=affinity_stack.base_url, api_key=affinity_stack.keys["a"], max_retries=0)
    for key in KEYS:
        # A lease that lapses on a loaded machine moves its shard, as it should; the
        # requests of a key are judged only where its three met one settled routing.
        for attempt in range(3):
            asked = f"{key}-{attempt}"
            before = shard_holders(affinity_stack.settings)
            first, *again = [ask(client, asked) for _ in range(3)]
            if shard_holders(affinity_stack.settings) == before:
                break
            wait_for_holders(affinity_stack.settings, 2)
        else:
            pytest.fail(f"the shards kept moving while {key} was asked")
        # At most the start every prompt shares (the system message) was cached before.
        assert first.usage.input_tokens_details.cached_tokens < whole_blocks(first.usage.input_tokens) // 2
        assert first.prompt_cache_key == asked
        # Two workers share the shards: without the routing each repeat would find its
        # prompt cached only when it happened to meet the first request's worker.
        for repeat in again:
            assert repeat.status == "completed"
            assert repeat.usage.input_tokens_details.cached_tokens == whole_blocks(repeat.usage.input_tokens)


def test_a_keys_requests_go_on_through_another_worker_when_theirs_dies_or_stops(affinity_stack):
    first = worker(affinity_stack, "worker-1")
    second = worker(affinity_stack, "worker-2")
    wait_for_holders(affinity_stack.settings, 2)
    client = openai.OpenAI(base_url=affinity_stack.base_url, api_key=affinity_stack.keys["a"], max_retries=0)
    for key in KEYS:
        ask(client, key)

    first.stop(signal.SIGKILL)
    # Its leases lapse; until then its shards' requests wait in JetStream, then are served.
    answered = [ask(client, key) for key in KEYS]
    assert [response.status for response in answered] == ["completed"] * len(KEYS)
    assert all(ask(client, key).usage.input_tokens_details.cached_tokens > 0 for key in KEYS)

    worker(affinity_stack, "worker-3")
    wait_for_holders(affinity_stack.settings, 2)
    assert second.stop(signal.SIGTERM) == 0  # hands its shards on as it goes
    wait_for_holders(affinity_stack.settings, 1)
    answered = [ask(client, key) for key in KEYS]
    assert [response.status for response in answered] == ["completed"] * len(KEYS)
