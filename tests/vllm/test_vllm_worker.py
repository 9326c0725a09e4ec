"""``steno worker --engine vllm`` as a process on real NATS: GenerationRequests in,
TokenBatch messages out (the last carrying the end), through the real GenerationWorker loop.

The worker serves the tiny model without a tokenizer (skip_tokenizer_init), so this also
covers that mode. The last test kills vLLM's engine core under a running request."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")
psutil = pytest.importorskip("psutil")

from steno.schemas.api import CreateResponseRequest  # noqa: E402
from steno.schemas.bus import (  # noqa: E402
    GenerationEnded,
    GenerationRequest,
    TokenBatch,
    TokenStreamMessage,
    end_of,
    token_partition_message,
    unpacked,
)
from steno.services.api.response_plan import plan_response  # noqa: E402
from steno.services.common import bus  # noqa: E402
from steno.services.dialects import dialect_named  # noqa: E402
from tests.vllm.conftest import ENGINE_ARGS  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

MODEL = "tiny-vllm"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def nats_url(request) -> str:
    """STENO_NATS_URL, else NATS on the standard port, else the suite's (embedded) one."""
    from steno.infra.embedded import DEFAULT_NATS_URL, answers

    if os.environ.get("STENO_NATS_URL"):
        return os.environ["STENO_NATS_URL"]
    if answers("127.0.0.1", 4222):
        return DEFAULT_NATS_URL
    return request.getfixturevalue("infrastructure").nats_url


@pytest.fixture(scope="module")
def names(nats_url):
    names = bus.Names(f"tv{secrets.token_hex(4)}", 4)
    yield names

    async def remove() -> None:
        nc = await bus.connect(bus.NatsOptions.from_url(nats_url), "steno-vllm-test-cleanup")
        try:
            await bus.remove_namespace(nc.jetstream(), names)
        finally:
            await nc.close()

    asyncio.run(remove())


class WorkerProcess:
    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.descendants: set[int] = set()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def remember_descendants(self) -> list:
        children = psutil.Process(self.process.pid).children(recursive=True)
        self.descendants |= {child.pid for child in children}
        return children

    def wait_for(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log():
            assert self.process.poll() is None, f"worker exited:\n{self.log()[-6000:]}"
            assert time.monotonic() < deadline, f"no {text!r} in time:\n{self.log()[-6000:]}"
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            with_children = self.remember_descendants()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            del with_children
        # vLLM's engine core normally leaves with the worker; never leave one behind.
        for pid in self.descendants:
            try:
                process = psutil.Process(pid)
                process.kill()
            except psutil.Error:
                pass


@pytest.fixture(scope="module")
def worker(tiny_weights_dir, nats_url, names, tmp_path_factory):
    env = {
        **os.environ,
        "STENO_NATS_URL": nats_url,
        "STENO_NAMESPACE": names.namespace,
        "STENO_TOKEN_PARTITIONS": str(names.token_partitions),
    }
    argv = [
        sys.executable, "-m", "steno.services.cli", "worker", "--engine", "vllm", "--model", MODEL,
        "--model-path", str(tiny_weights_dir), "--dtype", ENGINE_ARGS["dtype"],
        "--max-model-len", str(ENGINE_ARGS["max_model_len"]), "--enforce-eager",
        "--kv-cache-memory-bytes", str(ENGINE_ARGS["kv_cache_memory_bytes"]),
        "--batch-interval-ms", "20", "--drain-timeout", "20",
    ]
    running = WorkerProcess(argv, env, tmp_path_factory.mktemp("vllm-worker") / "worker.log")
    try:
        running.wait_for(f"worker for model {MODEL} (engine vllm) ready", timeout_s=240)
        running.remember_descendants()
        yield running
    finally:
        running.stop()


@pytest.fixture
async def js(nats_url, names):
    nc = await bus.connect(bus.NatsOptions.from_url(nats_url), "steno-vllm-test")
    jetstream = nc.jetstream()
    await bus.ensure_streams(jetstream, names)
    yield jetstream
    await nc.close()


def generation_request(user_input: str, **request_fields) -> GenerationRequest:
    response_id = f"resp_{secrets.token_hex(8)}"
    request = CreateResponseRequest(model=MODEL, input=user_input, **request_fields)
    return plan_response(request, response_id, "tenant", 1700000000,
                         dialect_named("harmony").render(request, 1700000000)).generation


async def publish(js, names: bus.Names, request: GenerationRequest) -> None:
    await js.publish(names.gen_subject(MODEL), request.model_dump_json().encode())


async def token_stream(js, names: bus.Names, response_id: str, timeout_s: float = 120.0, on_batch=None):
    """Every message of one response's token stream, up to the one carrying its end: on
    its own subject and in the groups of its partition."""
    partition = bus.partition_of(response_id, names.token_partitions)
    subscription = await js.subscribe(f"{names.namespace}.tokens.{partition}.>", stream=names.tokens_stream,
                                      ordered_consumer=True)
    messages: list[TokenStreamMessage] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no end for {response_id}; got {messages}"
            msg = await subscription.next_msg(timeout=remaining)
            for message, _ in unpacked(token_partition_message.validate_json(msg.data), None):
                if message.response_id != response_id:
                    continue
                messages.append(message)
                if isinstance(message, TokenBatch) and on_batch is not None:
                    await on_batch(message)
                if end_of(message) is not None:
                    return messages
    finally:
        await subscription.unsubscribe()


def check_stream(messages, request: GenerationRequest):
    batches, ended = messages, end_of(messages[-1])
    assert all(isinstance(b, TokenBatch) for b in batches)  # the last carries the end
    assert isinstance(ended, GenerationEnded)
    assert [b.batch_no for b in batches] == list(range(len(batches)))
    assert {b.attempt for b in batches} <= {ended.attempt}
    tokens = [t for b in batches for t in b.token_ids]
    assert ended.batch_count == len(batches)
    assert ended.output_tokens == len(tokens)
    assert ended.prompt_tokens == len(request.prompt_token_ids)
    return batches, ended, tokens


async def test_tokens_and_the_end_reach_the_bus_with_the_right_counts(worker, js, names):
    request = generation_request("Tell me a story.", max_output_tokens=40, top_logprobs=2, seed=1)
    await publish(js, names, request)
    batches, ended, _tokens = check_stream(await token_stream(js, names, request.response_id), request)
    assert ended.finish_reason == "length"
    assert ended.output_tokens == 40 and ended.error_message is None
    assert ended.cached_tokens is not None
    assert len(batches) >= 2  # coalesced per 20 ms, not one message per request
    for batch in batches:
        assert len(batch.logprobs) == len(batch.token_ids) == len(batch.top_logprobs)
        assert all(len(top) == 2 for top in batch.top_logprobs)


async def test_concurrent_requests_all_end_on_the_bus(worker, js, names):
    requests = [generation_request(f"Request number {i}.", max_output_tokens=24 + i, seed=i) for i in range(4)]
    for request in requests:
        await publish(js, names, request)
    streams = await asyncio.gather(*(token_stream(js, names, r.response_id) for r in requests))
    for request, messages in zip(requests, streams):
        _, ended, tokens = check_stream(messages, request)
        assert ended.finish_reason == "length"
        assert len(tokens) == request.sampling.max_tokens
        assert not any(isinstance(b, TokenBatch) and b.logprobs for b in messages)


async def test_structured_output_without_a_tokenizer_fails_visibly(worker, js, names):
    request = generation_request(
        "JSON please.", max_output_tokens=20, text={"format": {"type": "json_object"}}
    )
    assert request.sampling.structured_output is not None
    await publish(js, names, request)
    messages = await token_stream(js, names, request.response_id)
    _, ended, tokens = check_stream(messages, request)
    assert ended.finish_reason == "error" and tokens == []
    assert ended.error_code == "server_error" and "tokenizer" in ended.error_message


async def test_engine_core_death_fails_the_request_visibly_and_the_worker_exits(worker, js, names):
    request = generation_request("Go on for a long time.", max_output_tokens=1800)
    killed: list[int] = []

    async def kill_engine_core(batch: TokenBatch) -> None:
        if killed or not batch.token_ids:
            return
        cores = [p for p in worker.remember_descendants() if "EngineCore" in " ".join(p.cmdline()) + p.name()]
        assert cores, [p.cmdline() for p in worker.remember_descendants()]
        for core in cores:
            core.send_signal(signal.SIGKILL)
            killed.append(core.pid)

    await publish(js, names, request)
    messages = await token_stream(js, names, request.response_id, on_batch=kill_engine_core)
    assert killed
    _, ended, tokens = check_stream(messages, request)
    assert ended.finish_reason == "error"
    assert "died" in ended.error_message or "dead" in ended.error_message
    assert 0 < len(tokens) < 1800
    # The worker notices, stops taking work and exits non-zero for its supervisor.
    deadline = time.monotonic() + 90
    while worker.process.poll() is None:
        assert time.monotonic() < deadline, worker.log()[-6000:]
        await asyncio.sleep(0.5)
    assert worker.process.returncode == 1, worker.log()[-6000:]
    assert "engine died" in worker.log()
