"""What the services put on the bus, against the bus contract they serve at /asyncapi.json:
every message a stack of its own publishes while it serves a mix of requests lands on
exactly one channel of the document, and its body is that channel's message."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from dataclasses import dataclass
from typing import Any

import httpx
import nats
import openai
import pytest
from jsonschema import Draft202012Validator

from steno.infra.processes import Stack
from steno.services.common.bus_contract import asyncapi_document, channels_of
from tests.conftest import SLOW_MODEL, separate_stack, stepping_together_in_one_partition

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
KV_DELETES = ("DEL", "PURGE")


@dataclass(frozen=True)
class Captured:
    subject: str
    body: bytes
    headers: dict[str, str]


@pytest.fixture
def contract_stack(settings, tmp_path):
    with separate_stack(settings, "contract", tmp_path) as stack:
        # Two parsers: lease holders probe each other's presence.
        stack.add("parser", "parser")
        stack.add("parser-2", "parser")
        stack.add("worker", "worker", "--sim-tokens-per-s", "2000")
        stack.add("worker-slow", "worker", "--model", SLOW_MODEL, "--sim-tokens-per-s", "25")
        stack.add_api()
        # A second API process, to follow a response the first made.
        stack.add_api()
        yield stack


async def served_models(client: openai.AsyncOpenAI, models: set[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not models <= {model.id async for model in client.models.list()}:
        assert time.monotonic() < deadline, f"{models} never served"
        await asyncio.sleep(0.2)


async def serve_a_mix(client: openai.AsyncOpenAI, elsewhere: openai.AsyncOpenAI, partitions: int) -> None:
    """Streamed, blocking, cache-keyed, a function call, streams stepping together (so
    batches of one partition go out in groups), a background response streamed from
    another API process (which registers as its follower), and a background response
    cancelled."""
    stream = await client.responses.create(model=MODEL, input="stream this", stream=True)
    assert [event.type async for event in stream][-1] == "response.completed"
    assert (await client.responses.create(model=MODEL, input="a blocking one")).status == "completed"
    keyed = await client.responses.create(model=MODEL, input="keyed", prompt_cache_key="thread-1")
    assert keyed.status == "completed"
    called = await client.responses.create(model=MODEL, input="Paris", tools=[WEATHER])
    assert called.output[-1].type == "function_call"
    together, _ = await stepping_together_in_one_partition(client, SLOW_MODEL, partitions, "together " * 30)
    assert {(await client.responses.retrieve(rid)).status for rid in together} == {"completed"}
    followed = await client.responses.create(model=SLOW_MODEL, input="follow me", background=True)
    streamed = await elsewhere.responses.retrieve(followed.id, stream=True)
    assert [event.type async for event in streamed][-1] == "response.completed"
    job = await client.responses.create(model=SLOW_MODEL, input="cancel me " * 20, background=True)
    deadline = time.monotonic() + 30
    while not (await client.responses.retrieve(job.id)).output:
        assert time.monotonic() < deadline, "the background response never started"
        await asyncio.sleep(0.1)
    assert (await client.responses.cancel(job.id)).status == "cancelled"


async def taken_over(client: openai.AsyncOpenAI, stack: Stack) -> None:
    """A response whose worker is killed mid-generation, continued by another: the
    second attempt records its takeover."""
    job = await client.responses.create(model=SLOW_MODEL, input="take me over " * 20, background=True)
    deadline = time.monotonic() + 30
    while not (await client.responses.retrieve(job.id)).output:
        assert time.monotonic() < deadline, "the background response never started"
        await asyncio.sleep(0.1)
    next(process for process in stack.processes if process.name == "worker-slow").stop(signal.SIGKILL)
    stack.add("worker-slow-2", "worker", "--model", SLOW_MODEL, "--sim-tokens-per-s", "25")
    deadline = time.monotonic() + 60
    while (await client.responses.retrieve(job.id)).status == "in_progress":
        assert time.monotonic() < deadline, "nothing continued the response"
        await asyncio.sleep(0.2)
    assert (await client.responses.retrieve(job.id)).status == "completed"


def violations(document: dict[str, Any], message: Captured) -> list[str]:
    """What is wrong with one message by the document: no channel or several, or a body
    that is not the channel's message."""
    matched = channels_of(document, message.subject)
    if len(matched) != 1:
        return [f"{message.subject}: matches {matched or 'no channel'}"]
    channel = matched[0]
    described = document["components"]["messages"][f"{channel}:Message"]
    kv_operation = message.headers.get("KV-Operation")
    if kv_operation is not None and "KV-Operation" in described.get("headers", {}).get("properties", {}):
        return [] if kv_operation in KV_DELETES and not message.body else [f"{message.subject}: KV {kv_operation}"]
    body: Any = message.body.decode()
    if described["contentType"] == "application/json":
        body = json.loads(body)
    validator = Draft202012Validator({**described["payload"], "components": document["components"]})
    return [f"{message.subject} ({channel}): {error.message}" for error in validator.iter_errors(body)]


async def test_everything_the_services_publish_is_a_message_of_the_contract(contract_stack):
    namespace = contract_stack.settings.namespace
    document = asyncapi_document(namespace)
    api_root = contract_stack.base_url.removesuffix("/v1")
    async with httpx.AsyncClient() as http:
        served = await http.get(f"{api_root}/asyncapi.json")
    assert served.status_code == 200 and served.json() == document

    captured: list[Captured] = []

    async def capture(msg: Any) -> None:
        if msg.subject.startswith("$KV.") and not msg.subject.startswith(f"$KV.{namespace}_"):
            return  # another namespace's buckets
        captured.append(Captured(msg.subject, msg.data, dict(msg.headers or {})))

    nc = await nats.connect(contract_stack.settings.nats_url)
    client = openai.AsyncOpenAI(base_url=contract_stack.base_url, api_key=contract_stack.keys["a"], max_retries=0)
    elsewhere = openai.AsyncOpenAI(base_url=contract_stack.url_of(1), api_key=contract_stack.keys["a"], max_retries=0)
    try:
        # Core NATS subscribers see JetStream's publishes (KV puts included) too.
        await nc.subscribe(f"{namespace}.>", cb=capture)
        await nc.subscribe("$KV.>", cb=capture)
        await served_models(client, {MODEL, SLOW_MODEL})
        await serve_a_mix(client, elsewhere, contract_stack.settings.token_partitions)
        await taken_over(client, contract_stack)
        # JetStream's own advisories come from a request's failures, not from this mix
        # (tests/integration/test_worker_liveness.py reads one).
        every_channel = {key for key, channel in document["channels"].items()
                         if channel["x-steno"]["publishers"] != ["jetstream"]}
        deadline = time.monotonic() + 30
        while (seen := {channel for message in captured for channel in channels_of(document, message.subject)}) \
                != every_channel and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
        await client.close()
        await elsewhere.close()

    assert seen == every_channel, f"nothing seen on {every_channel - seen}"
    wrong = [problem for message in captured for problem in violations(document, message)]
    assert not wrong, "\n".join(wrong[:20])
    token_messages = [json.loads(m.body) for m in captured if channels_of(document, m.subject) == ["token-stream"]]
    ends = [message if message["kind"] == "ended" else message.get("ended") for message in token_messages]
    assert "cancelled" in {end["finish_reason"] for end in ends if end}
