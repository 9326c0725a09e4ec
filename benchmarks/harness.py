"""``steno bench``: what the pipeline costs, measured side by side with an in-process
server on the same engine and prompts (results as JSON plus a PNG chart).

Scenarios:
  ttfe        time to first event added by the pipeline, p50/p99, at 1, 16, 128 streams
  throughput  tokens/s and events/s end to end (simulator at full speed), scaling streams
              until latency degrades, with each process's CPU use to show the bottleneck
  parser      the parser and event log alone: token batches already on the bus, drained
              as fast as the parser can; tokens/s and the cores it used
  fanout      idle SSE tails held open on one edge process, and memory per tail
  replay      time to replay a finished 10,000-event response to a client
  storage     bytes per event and per token in Postgres
  cancel      time from POST /cancel to the terminal event, for generating responses
  retention   stream latency while the sweeper deletes a backlog of expired responses
              (with their events), against the same streams with nothing to sweep
  affinity    multi-turn conversations over several workers of one model, with and
              without prompt_cache_key: the share of prompt tokens found in the serving
              worker's prefix cache (the simulator's model of one)
  steady      long streams at a steady rate (1,000 tokens at 50 tokens/s each), side by
              side: added latency per delta, CPU and Postgres writes per 1,000 tokens, and
              the most streams whose added p99 stays under a limit (benchmarks/steady.py)
  vllm        Steno with a vLLM worker against vLLM's own OpenAI server on the same tiny
              model (needs vLLM: ``infra/vllm-env run steno bench --scenarios vllm``)

NATS and Postgres are found like everything else (STENO_* variables, standard ports, or
embedded); the run uses a namespace and a database of its own and removes them.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
from nats.js import JetStreamContext

from steno.benchmarks.command import DEFAULT_TOKEN_PARTITIONS, SCENARIOS
from steno.benchmarks.profiles import Profiler
from steno.benchmarks.sse_client import HttpError, SseClient
from steno.benchmarks.vllm_side_by_side import side_by_side
from steno.benchmarks.work_counts import Reading, log_shape, per_request, printed, read
from steno.infra.embedded import free_port, resolve
from steno.infra.processes import ServiceProcess, Stack, remove_namespace, wait_healthy
from steno.schemas.api import CreateResponseRequest
from steno.schemas.bus import GenerationEnded, TokenBatch, TokenStreamMessage
from steno.schemas.responses import ParseContext
from steno.services.api.response_plan import plan_response
from steno.services.api.retention import COMPACT_BATCH, RetentionSweeper
from steno.services.api.store import TERMINAL_STATUSES, ResponseStore
from steno.services.common.bus import Names, connect, ensure_streams
from steno.services.common.config import ApiSettings
from steno.services.common.metrics import consumer_states
from steno.services.common.migrate import database_url_named, drop_database, ensure_database, upgrade
from steno.services.common.model_files import publish_model_files
from steno.services.common.nats_options import SECURITY_VARIABLES
from steno.services.common.runtime import event_loop_factory
from steno.services.dialects import DEFAULT_DIALECT, CompletionMessage, Dialect, chat_template_dialect, dialect_named
from steno.services.dialects.chat_template.families import FAMILIES
from steno.services.dialects.chat_template.files import files_for_family
from steno.services.parser.event_log import EventLog, ResponseWrite
from steno.services.parser.response_state import ResponseState
from steno.services.worker.simulator import completion_tokens

MODEL = "steno-simulator"
IDLE_MODEL = "steno-idle"
SLOW_MODEL = "steno-slow"
AFFINITY_MODEL = "steno-affinity"
CONTENT_EVENTS = (b"response.reasoning_text.delta", b"response.output_text.delta")
LONG_INPUT = " ".join(f"word{i}" for i in range(70))
# ttfe: rounds in a row before the other side takes its turn.
ROUNDS_PER_BLOCK = 10
# The storage scenario measures what the run stored; with fewer events than this (run
# alone) it first stores its own, a closed loop of this many streams for this long.
STORAGE_MIN_EVENTS = 10_000
STORAGE_LOAD_STREAMS = 16
STORAGE_LOAD_S = 10.0
# Rounds of that load before the scenario gives up on a machine too slow to store enough.
STORAGE_LOAD_ROUNDS = 12


def yardstick_ms() -> float:
    """A fixed piece of pure-Python work, timed (best of five): this shared machine's speed
    drifts threefold between days, and figures from two runs compare only when this does."""
    return min(timeit.repeat("sum(range(100000))", number=20, repeat=5)) / 20 * 1000


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class PausedBlock:
    # This process's CPU seconds within the block, the collection after it left out.
    cpu_s: float = 0.0


@contextmanager
def collector_paused() -> Iterator[PausedBlock]:
    """This process's cyclic garbage collector off while streams are measured, as
    ``timeit`` turns it off while it times. This process is the load generator and
    stamps each delta's arrival; a full collection over what a level has recorded paused
    it for about a tenth of a second at a time, and every delta that arrived meanwhile
    was stamped late, on both sides (docs/performance.md). What the collector would have
    freed meanwhile is collected after, once the block's CPU is read: that collection
    runs while no stream does, and costs more than the streams of a short block."""
    enabled = gc.isenabled()
    gc.disable()
    block = PausedBlock()
    started = time.process_time()
    try:
        yield block
    finally:
        block.cpu_s = time.process_time() - started
        if enabled:
            gc.enable()
        gc.collect()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(command: str) -> float:
    """CPU seconds of every process whose command name is ``command`` (all of Postgres's
    backends, say); processes that ended in between are not counted."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == command:
                    total += cpu_seconds(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
    return total


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def one_stream(client: SseClient, text: str) -> dict[str, Any]:
    """One streaming request: when its first event and first content came, and totals
    (``error`` set when the request failed)."""
    started = time.perf_counter()
    try:
        reply = await client.post_stream("/v1/responses", {"model": MODEL, "input": text, "stream": True})
    except HttpError as exc:
        done = time.perf_counter() - started
        return {"first_event_s": done, "first_content_s": done, "total_s": done, "events": 0, "tokens": 0,
                "error": str(exc)}
    done = time.perf_counter()
    frames = reply.frames
    first = frames[0][0] if frames else done
    first_content = next((at for at, data in frames if any(kind in data[:60] for kind in CONTENT_EVENTS)), done)
    tokens = next((orjson.loads(data)["response"]["usage"]["output_tokens"] for _, data in reversed(frames)
                   if data.startswith(b'{"type":"response.completed"')), 0)
    return {"first_event_s": first - started, "first_content_s": first_content - started,
            "total_s": done - started, "events": len(frames), "tokens": tokens}


def _ttfe_summary(samples: list[dict[str, Any]], cpu: dict[str, float]) -> dict[str, Any]:
    ok = [s for s in samples if "error" not in s]
    first = [s["first_event_s"] * 1000 for s in ok]
    content = [s["first_content_s"] * 1000 for s in ok]
    return {"samples": len(samples), "errors": len(samples) - len(ok),
            "error_kinds": sorted({s["error"] for s in samples if "error" in s}),
            "first_event_ms_p50": pct(first, .5), "first_event_ms_p99": pct(first, .99),
            "first_content_ms_p50": pct(content, .5), "first_content_ms_p99": pct(content, .99),
            "cpu_ms_per_request": {process: round(used * 1000 / len(samples), 2)
                                   for process, used in cpu.items() if used > 0}}


class Bench:
    def __init__(self, work: Path, api_replicas: int = 1, token_partitions: int = DEFAULT_TOKEN_PARTITIONS) -> None:
        self.work = work
        self.api_replicas = api_replicas
        self.infra = resolve(work / "infra")
        run_id = secrets.token_hex(3)
        self.database_url = database_url_named(self.infra.database_url, f"steno_bench_{run_id}")
        # NATS credentials and TLS as the environment gives them (STENO_NATS_*), like any
        # steno command; the rest is the benchmark's own.
        env = ApiSettings.from_env()
        self.settings = ApiSettings(nats_url=self.infra.nats_url, database_url=self.database_url,
                                    namespace=f"b{run_id}", token_partitions=token_partitions, auth_disabled=True,
                                    model_wait_s=10, **{name: getattr(env, name) for name in SECURITY_VARIABLES})
        self.stack = Stack(self.settings, work)
        self.baseline: ServiceProcess | None = None
        self.baseline_port = free_port()
        self.shared_api_port = free_port() if api_replicas > 1 else None
        # Set where the run profiles (--profile).
        self.profiler: Profiler | None = None

    async def start(self) -> None:
        await ensure_database(self.database_url)
        await asyncio.to_thread(upgrade, self.database_url)
        self.stack.add("parser", "parser")
        self.stack.add("worker", "worker", "--sim-tokens-per-s", "0", "--concurrency", "256")
        self.stack.add("worker-idle", "worker", "--model", IDLE_MODEL, "--sim-first-token-delay-ms", "3600000")
        self.stack.add("worker-slow", "worker", "--model", SLOW_MODEL, "--sim-tokens-per-s", "20")
        for _ in range(self.api_replicas):
            self.stack.add_api(shared_port=self.shared_api_port)
        self.baseline = await self.start_baseline("baseline", self.baseline_port)
        await asyncio.sleep(3)  # the parser takes its partitions

    async def server_versions(self) -> dict[str, str]:
        """The versions of the NATS and Postgres servers the run uses: their CPU per
        request differs from release to release (docs/performance.md)."""
        nc = await connect(self.settings, "steno-bench-versions")
        try:
            nats_version = nc.connected_server_version
        finally:
            await nc.close()
        conn = await asyncpg.connect(self.database_url)
        try:
            postgres_version = await conn.fetchval("SHOW server_version")
        finally:
            await conn.close()
        return {"nats": f"{nats_version.major}.{nats_version.minor}.{nats_version.patch}",
                "postgres": postgres_version.split()[0]}

    async def start_baseline(self, name: str, port: int, *flags: str) -> ServiceProcess:
        """A baseline server (``benchmarks/baseline.py``) with its own flags, once healthy."""
        with open(self.work / f"{name}.log", "ab") as log:
            process = subprocess.Popen([sys.executable, "-m", "steno.benchmarks.baseline", "--port", str(port), *flags],
                                       stdout=log, stderr=subprocess.STDOUT)
        baseline = ServiceProcess(name, [], self.work / f"{name}.log", process)
        await asyncio.to_thread(wait_healthy, f"http://127.0.0.1:{port}", baseline)
        return baseline

    @property
    def steno_url(self) -> str:
        """Where streams go: the API process, or the port that several share, as ``steno up
        --api N`` runs them (the kernel spreads the connections over them)."""
        if self.shared_api_port is not None:
            return f"http://127.0.0.1:{self.shared_api_port}/v1/responses"
        return self.stack.base_url + "/responses"

    @property
    def baseline_url(self) -> str:
        return f"http://127.0.0.1:{self.baseline_port}/v1/responses"

    def pids(self) -> dict[str, int]:
        processes = [*self.stack.processes, *([self.baseline] if self.baseline is not None else [])]
        return {p.name: p.pid for p in processes if p.process is not None}

    def serving(self, worker: str = "worker") -> list[str]:
        """Steno's processes that serve a scenario whose model ``worker`` generates."""
        return [name for name in self.pids() if name == worker or not name.startswith(("worker", "baseline"))]

    @asynccontextmanager
    async def profiled(self, label: str, services: Iterable[str]) -> AsyncIterator[None]:
        """``services`` sampled while the block runs, where the run profiles."""
        if self.profiler is None:
            yield
            return
        pids = self.pids()
        async with self.profiler.profiling(label, {name: pids[name] for name in services}):
            yield

    def cpu_by_process(self) -> dict[str, float]:
        """CPU seconds so far of each service, of the load generator, and of Postgres and
        NATS where they run on this machine."""
        used = {name: cpu_seconds(pid) for name, pid in self.pids().items()}
        used["client"] = cpu_seconds(os.getpid())
        for command in ("postgres", "nats-server"):
            used[command] = group_cpu_seconds(command)
        return used

    @asynccontextmanager
    async def _servers(self) -> AsyncIterator[tuple[JetStreamContext, asyncpg.Connection]]:
        nc = await connect(self.settings, "steno-bench-counts")
        conn = await asyncpg.connect(self.database_url)
        try:
            yield nc.jetstream(), conn
        finally:
            await conn.close()
            await nc.close()

    async def work_reading(self) -> Reading:
        """The stack's bus and database counters as they stand (``benchmarks/work_counts.py``)."""
        async with self._servers() as (js, conn):
            return await read(js, conn, Names.from_settings(self.settings))

    async def work_since(self, before: Reading, requests: int) -> dict[str, Any]:
        """What the stack's bus and database did since ``before``, per request of ``requests``."""
        async with self._servers() as (js, conn):
            after = await read(js, conn, Names.from_settings(self.settings))
            return per_request(before, after, await log_shape(conn, before.at), requests)

    async def stop(self) -> None:
        self.stack.stop()
        for suffix in ("", "p"):  # the stack's namespace and the parser scenario's
            settings = self.settings.with_changes(namespace=self.settings.namespace + suffix)
            await asyncio.to_thread(remove_namespace, settings)
        if self.baseline is not None:
            self.baseline.stop(timeout_s=10)
        await drop_database(self.database_url)
        self.infra.stop()

    # -- scenarios ----------------------------------------------------------------
    async def ttfe(self, levels: list[int], samples_wanted: int) -> dict[str, Any]:
        """Rounds of ``level`` streams started together, back to back (a server that is
        serving), in blocks that alternate between Steno and the baseline, so both sides
        meet the machine in the same state (a shared machine's speed drifts over minutes)
        and ``added`` compares like with like."""
        out: dict[str, Any] = {}
        sides = {"steno": self.steno_url, "baseline": self.baseline_url}
        for level in levels:
            rounds = max(3, samples_wanted // level)
            samples: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
            client_cpu = dict.fromkeys(sides, 0.0)
            async with AsyncExitStack() as stack:
                clients = {name: await stack.enter_async_context(SseClient(url, connections=level))
                           for name, url in sides.items()}
                # Warm at the measured concurrency: connections (HTTP, pools) are open, as in a
                # server that has been serving; the first burst after a start measures start-up.
                for side in clients.values():
                    await asyncio.gather(*(one_stream(side, "warm up") for _ in range(level)))
                before = self.cpu_by_process()
                counted = await self.work_reading()
                async with self.profiled(f"ttfe-{level}", self.serving()):
                    for block in range(0, rounds, ROUNDS_PER_BLOCK):
                        for name, side in clients.items():
                            with collector_paused() as paused:
                                for _ in range(min(ROUNDS_PER_BLOCK, rounds - block)):
                                    samples[name] += await asyncio.gather(
                                        *(one_stream(side, f"ttfe {i}") for i in range(level)))
                            client_cpu[name] += paused.cpu_s
                after = self.cpu_by_process()
                work = await self.work_since(counted, len(samples["steno"]))
            # Each side's own processes: the baseline is one process; Postgres and NATS serve Steno only.
            used = {process: after[process] - before[process] for process in before if process != "client"}
            cpu = {"steno": {process: seconds for process, seconds in used.items() if process != "baseline"},
                   "baseline": {"baseline": used["baseline"]}}
            for name in sides:
                cpu[name]["client"] = client_cpu[name]
            row: dict[str, Any] = {name: _ttfe_summary(samples[name], cpu[name]) for name in sides}
            row["steno"]["work_per_request"] = work
            for metric in ("first_content", "first_event"):
                for q in ("p50", "p99"):
                    row[f"added_{metric}_ms_{q}"] = (row["steno"][f"{metric}_ms_{q}"]
                                                     - row["baseline"][f"{metric}_ms_{q}"])
            out[str(level)] = row
            print(f"ttfe {level:>4} streams: steno first content p50 {row['steno']['first_content_ms_p50']:.1f} ms "
                  f"p99 {row['steno']['first_content_ms_p99']:.1f} ms | baseline p50 "
                  f"{row['baseline']['first_content_ms_p50']:.1f} ms"
                  f" p99 {row['baseline']['first_content_ms_p99']:.1f} ms"
                  f" | added p50 {row['added_first_content_ms_p50']:.1f} ms"
                  f" p99 {row['added_first_content_ms_p99']:.1f} ms"
                  f" | first event added p50 {row['added_first_event_ms_p50']:.1f} ms"
                  f" p99 {row['added_first_event_ms_p99']:.1f} ms"
                  f" | errors {row['steno']['errors']}/{row['baseline']['errors']}"
                  f" | CPU ms per request {row['steno']['cpu_ms_per_request']}"
                  f" / {row['baseline']['cpu_ms_per_request']}"
                  f" | steno {printed(work)}",
                  flush=True)
        return out

    async def _closed_loop(self, url: str, level: int, seconds: float) -> dict[str, Any]:
        deadline = time.perf_counter() + seconds
        samples: list[dict[str, Any]] = []
        async with SseClient(url, connections=level) as client:
            async def loop(i: int) -> None:
                while time.perf_counter() < deadline:
                    samples.append(await one_stream(client, f"{i} {LONG_INPUT}"))

            with collector_paused():
                started = time.perf_counter()
                await asyncio.gather(*(loop(i) for i in range(level)))
                elapsed = time.perf_counter() - started
        latency = [s["total_s"] * 1000 for s in samples if "error" not in s]
        return {"requests": len(samples), "errors": sum("error" in s for s in samples),
                "tokens_per_s": sum(s["tokens"] for s in samples) / elapsed,
                "events_per_s": sum(s["events"] for s in samples) / elapsed,
                "latency_ms_p50": pct(latency, .5), "latency_ms_p99": pct(latency, .99)}

    async def _stage_backlogs(self, stop: asyncio.Event, every_s: float = 1.0) -> dict[str, dict[str, float]]:
        """Samples JetStream's per-stage counters while a run lasts: requests waiting for
        a worker (GEN), and token messages waiting for the parser (TOKENS, all
        partitions). The stage whose queue grows is the bottleneck. One listing per
        stream and sample, as the API's gauges read them: a request per consumer, four
        times a second, cost NATS a share of the CPU the run measures."""
        names = Names.from_settings(self.settings)
        parsers = {names.parser_consumer(partition) for partition in range(names.token_partitions)}
        nc = await connect(self.settings, "steno-bench-backlogs")
        js = nc.jetstream()
        samples: dict[str, list[int]] = {"generation_waiting": [], "tokens_waiting_for_parser": []}
        try:
            while not stop.is_set():
                work = await consumer_states(js, names.gen_stream)
                tokens = await consumer_states(js, names.tokens_stream)
                samples["generation_waiting"].append(
                    sum(c.pending for c in work if c.name == names.worker_consumer(MODEL)))
                samples["tokens_waiting_for_parser"].append(
                    sum(c.pending + c.ack_pending for c in tokens if c.name in parsers))
                with suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), every_s)
        finally:
            await nc.close()
        return {stage: {"mean": round(sum(values) / max(len(values), 1), 1), "max": max(values, default=0)}
                for stage, values in samples.items()}

    async def throughput(self, levels: list[int], seconds: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
        first_p99 = None
        for level in levels:
            before = self.cpu_by_process()
            counted = await self.work_reading()
            stop_sampling = asyncio.Event()
            backlogs = asyncio.create_task(self._stage_backlogs(stop_sampling))
            started = time.perf_counter()
            async with self.profiled(f"throughput-{level}", self.serving()):
                steno = await self._closed_loop(self.steno_url, level, seconds)
            wall = time.perf_counter() - started
            stop_sampling.set()
            after = self.cpu_by_process()
            steno["cpu_cores"] = {name: round((after[name] - used) / wall, 2) for name, used in before.items()
                                  if name != "baseline" and after[name] - used > 0}
            steno["stage_backlog"] = await backlogs
            baseline = await self._closed_loop(self.baseline_url, level, seconds)
            steno["work_per_request"] = await self.work_since(counted, steno["requests"])
            out[str(level)] = {"steno": steno, "baseline": baseline,
                               "ratio_tokens_per_s": steno["tokens_per_s"] / max(baseline["tokens_per_s"], 1e-9)}
            print(f"throughput {level:>4} streams: steno {steno['tokens_per_s']:,.0f} tok/s "
                  f"{steno['events_per_s']:,.0f} ev/s p99 {steno['latency_ms_p99']:.0f} ms | baseline "
                  f"{baseline['tokens_per_s']:,.0f} tok/s | cores {steno['cpu_cores']} | backlog "
                  f"{steno['stage_backlog']} | {printed(steno['work_per_request'])}", flush=True)
            first_p99 = first_p99 or steno["latency_ms_p99"]
            if steno["latency_ms_p99"] > 4 * first_p99:
                print("throughput: latency degraded; stopping the ramp", flush=True)
                break
        return out

    async def parser(self, responses: int, batch_tokens: int, family: str | None = None) -> dict[str, Any]:
        """Publishes every batch first, then lets a fresh parser (in its own namespace) drain
        them. ``family``: a chat-template family's simulated model (its byte-level
        vocabulary) instead of gpt-oss."""
        settings = self.settings.with_changes(namespace=self.settings.namespace + "p")
        names = Names.from_settings(settings)
        pool = await asyncpg.create_pool(self.database_url, min_size=1, max_size=4)
        store = ResponseStore(pool)
        nc = await connect(settings, "steno-bench-parser")
        js = nc.jetstream()
        await ensure_streams(js, names)
        dialect: Dialect = dialect_named(DEFAULT_DIALECT)
        if family is not None:
            files = files_for_family(FAMILIES[family])
            await publish_model_files(js, names, files)
            dialect = chat_template_dialect(files)
        total_tokens = 0
        ids = []
        for i in range(responses):
            request = CreateResponseRequest(model=MODEL, input=f"{i} {LONG_INPUT}", background=True)
            plan = plan_response(request, f"resp_bench{settings.namespace}{i:06d}", "bench", 1_700_000_000,
                                 dialect.render(request, 1_700_000_000))
            await store.create(plan.record, plan.first_events)
            tokens = completion_tokens(dialect, plan.generation.prompt_token_ids)
            rid = plan.record.response_id
            ids.append(rid)
            batch_no = 0
            for start in range(0, len(tokens), batch_tokens):
                batch = TokenBatch(response_id=rid, attempt=0, batch_no=batch_no,
                                   token_ids=tokens[start:start + batch_tokens])
                await js.publish(names.tokens_subject(rid), batch.model_dump_json().encode())
                batch_no += 1
            ended = GenerationEnded(response_id=rid, attempt=0, batch_count=batch_no, finish_reason="stop",
                                    prompt_tokens=len(plan.generation.prompt_token_ids), output_tokens=len(tokens))
            await js.publish(names.tokens_subject(rid), ended.model_dump_json().encode())
            total_tokens += len(tokens)
        await nc.close()
        stack = Stack(settings, self.work)
        parser = stack.add("parser-bench", "parser")
        progress = "SELECT count(*) FILTER (WHERE status <> 'queued'), count(*) FILTER (WHERE status = ANY($2))," \
                   " count(*) FILTER (WHERE status = 'completed') FROM responses WHERE id = ANY($1)"
        terminal = sorted(TERMINAL_STATUSES)
        try:
            # The clock starts at the first sign of progress, after the parser's own start-up.
            while (await pool.fetchrow(progress, ids, terminal) or (0, 0, 0))[0] == 0:
                before, started = cpu_seconds(parser.pid), time.perf_counter()
                await asyncio.sleep(0.01)
            while (counts := await pool.fetchrow(progress, ids, terminal) or (0, 0, 0))[1] < responses:
                await asyncio.sleep(0.02)
            elapsed = time.perf_counter() - started
            cores = (cpu_seconds(parser.pid) - before) / elapsed
        finally:
            stack.stop()
            await pool.close()
        if counts[2] < responses:
            raise RuntimeError(f"parser: {responses - counts[2]} of the {responses} responses ended other than "
                               "completed")
        result = {"dialect": family or DEFAULT_DIALECT, "responses": responses, "tokens": total_tokens,
                  "batch_tokens": batch_tokens, "seconds": elapsed, "tokens_per_s": total_tokens / elapsed,
                  "parser_cpu_cores": cores, "tokens_per_cpu_second": total_tokens / max(cores * elapsed, 1e-9)}
        print(f"parser ({result['dialect']}): {total_tokens:,} tokens in {responses} responses "
              f"({batch_tokens}-token batches) drained in "
              f"{elapsed:.2f}s = {result['tokens_per_s']:,.0f} tok/s using {cores:.2f} cores "
              f"({result['tokens_per_cpu_second']:,.0f} tok per CPU-second)", flush=True)
        return result

    async def fanout(self, clients: int) -> dict[str, Any]:
        api = next(p for p in self.stack.processes if p.name.startswith("api"))
        async with httpx.AsyncClient(timeout=30) as http:
            body = {"model": IDLE_MODEL, "input": "idle", "background": True}
            created = (await http.post(self.steno_url, json=body)).json()
        url = f"{self.steno_url}/{created['id']}"
        await asyncio.sleep(1)
        rss_before = rss_bytes(api.pid)
        opened = 0
        limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=httpx.Timeout(60, connect=30), limits=limits) as http:
            ready = asyncio.Event()
            tails_ready = 0

            async def tail() -> None:
                nonlocal tails_ready, opened
                async with http.stream("GET", url, params={"stream": "true"}) as reply:
                    async for line in reply.aiter_lines():
                        if line.startswith("data: "):
                            opened += 1
                            break
                    tails_ready += 1
                    if tails_ready == clients:
                        ready.set()
                    await asyncio.sleep(3600)

            tasks = [asyncio.create_task(tail()) for _ in range(clients)]
            with suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), 120)
            await asyncio.sleep(2)
            rss_after = rss_bytes(api.pid)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        async with httpx.AsyncClient(timeout=30) as http:
            await http.post(f"{url}/cancel")
        result = {"clients": clients, "tails_receiving": opened, "api_rss_before_mb": rss_before / 2**20,
                  "api_rss_after_mb": rss_after / 2**20, "kib_per_client": (rss_after - rss_before) / 1024 / clients}
        print(f"fanout: {opened}/{clients} idle tails on one edge process; RSS {rss_before / 2**20:.0f} -> "
              f"{rss_after / 2**20:.0f} MiB ({result['kib_per_client']:.1f} KiB per tail)", flush=True)
        return result

    async def replay(self, events_wanted: int) -> dict[str, Any]:
        """A finished response of ``events_wanted`` events (one token per batch), replayed."""
        dialect = dialect_named(DEFAULT_DIALECT)
        pool = await asyncpg.create_pool(self.database_url, min_size=1, max_size=2)
        words = " ".join(f"w{i}" for i in range(events_wanted))
        request = CreateResponseRequest(model=MODEL, input="replay")
        rid = "resp_replay" + secrets.token_hex(8)
        plan = plan_response(request, rid, "default", 1_700_000_000, dialect.render(request, 1_700_000_000))
        await ResponseStore(pool).create(plan.record, plan.first_events)
        tokens = dialect.write_completion([CompletionMessage("final", words)])[: events_wanted - 8]
        state = ResponseState(rid, plan.record.base_snapshot, ParseContext())
        write = ResponseWrite(rid)
        batches: list[TokenStreamMessage] = [TokenBatch(response_id=rid, attempt=0, batch_no=i, token_ids=[token])
                                             for i, token in enumerate(tokens)]
        batches.append(GenerationEnded(response_id=rid, attempt=0, batch_count=len(tokens), finish_reason="stop",
                                       prompt_tokens=10, output_tokens=len(tokens)))
        for message in batches:
            applied = state.apply(message)
            assert applied is not None  # every message is new
            write.events += applied.events
            write.consumed += applied.recorded
        write.final_snapshot = state.final_snapshot
        await EventLog(pool).commit([write])
        count = await pool.fetchval("SELECT count(*) FROM response_events WHERE response_id = $1", rid)

        async def replayed() -> tuple[list[float], int]:
            times, received = [], 0
            async with httpx.AsyncClient(timeout=60) as http:
                for _ in range(6):
                    started = time.perf_counter()
                    async with http.stream("GET", f"{self.steno_url}/{rid}", params={"stream": "true"}) as reply:
                        received = len([line async for line in reply.aiter_lines() if line.startswith("data: ")])
                    times.append((time.perf_counter() - started) * 1000)
            return times[1:], received

        try:
            times, received = await replayed()
            # The same response once the sweep has compacted it (everything ended is, here).
            while await ResponseStore(pool).compact_ended(COMPACT_BATCH, 0) == COMPACT_BATCH:
                pass
            compacted_times, compacted_received = await replayed()
        finally:
            await pool.close()
        result = {"events": count, "received": received, "replay_ms_p50": pct(times, .5),
                  "replay_ms_max": max(times), "received_compacted": compacted_received,
                  "replay_ms_p50_compacted": pct(compacted_times, .5), "replay_ms_max_compacted": max(compacted_times)}
        print(f"replay: {received}/{count} events in {result['replay_ms_p50']:.0f} ms (p50 of 5, max "
              f"{result['replay_ms_max']:.0f} ms); compacted: {compacted_received} in "
              f"{result['replay_ms_p50_compacted']:.0f} ms (max {result['replay_ms_max_compacted']:.0f} ms)",
              flush=True)
        return result

    async def cancel(self, count: int) -> dict[str, Any]:
        """POST /cancel returns once the terminal event is in the log: its latency is the
        time from the order to the end of the stream."""
        times = []
        async with httpx.AsyncClient(timeout=60) as http:
            for i in range(count):
                body = {"model": SLOW_MODEL, "input": f"cancel {i} {LONG_INPUT}", "background": True}
                created = (await http.post(self.steno_url, json=body)).json()
                await asyncio.sleep(0.5)  # generating by now
                started = time.perf_counter()
                reply = (await http.post(f"{self.steno_url}/{created['id']}/cancel")).json()
                times.append((time.perf_counter() - started) * 1000)
                assert reply["status"] == "cancelled", reply
        result = {"cancels": count, "ms_p50": pct(times, .5), "ms_p99": pct(times, .99), "ms_max": max(times)}
        print(f"cancel: POST /cancel -> terminal event {result['ms_p50']:.0f} ms p50, {result['ms_p99']:.0f} ms p99 "
              f"({count} generating responses)", flush=True)
        return result

    async def affinity(self, workers: int, conversations: int, turns: int) -> dict[str, Any]:
        """Each conversation chains its turns by previous_response_id, all conversations at
        once; a turn's prompt holds every earlier turn, so the worker that served the last
        turn has most of it cached. Without a key a turn meets that worker by chance."""
        for n in range(workers):
            self.stack.add(f"worker-affinity-{n}", "worker", "--model", AFFINITY_MODEL, "--sim-tokens-per-s", "0")
        await asyncio.sleep(10)  # registered, and the shards shared out (a few lease rounds)

        async def converse(http: httpx.AsyncClient, name: str, keyed: bool) -> tuple[int, int]:
            found = asked = 0
            previous = None
            for turn in range(turns):
                body: dict[str, Any] = {"model": AFFINITY_MODEL, "input": f"{name} turn {turn}: {LONG_INPUT}",
                                        "previous_response_id": previous}
                if keyed:
                    body["prompt_cache_key"] = name
                reply = (await http.post(self.steno_url, json=body)).json()
                previous = reply["id"]
                if turn > 0:  # the first turn has no earlier turn to find
                    found += reply["usage"]["input_tokens_details"]["cached_tokens"]
                    asked += reply["usage"]["input_tokens"]
            return found, asked

        result: dict[str, Any] = {"workers": workers, "conversations": conversations, "turns": turns}
        async with httpx.AsyncClient(timeout=120) as http:
            for keyed in (False, True):
                started = time.perf_counter()
                counts = await asyncio.gather(*(converse(http, f"{'keyed' if keyed else 'unkeyed'}-{i}", keyed)
                                                for i in range(conversations)))
                mode = "with_key" if keyed else "without_key"
                result[mode] = {"cached_share": sum(f for f, _ in counts) / max(sum(a for _, a in counts), 1),
                                "seconds": time.perf_counter() - started}
        print(f"affinity: {conversations} conversations x {turns} turns over {workers} workers: prompt tokens "
              f"found cached {result['without_key']['cached_share']:.0%} without prompt_cache_key, "
              f"{result['with_key']['cached_share']:.0%} with it", flush=True)
        return result

    async def retention(self, expired: int, level: int, rounds: int) -> dict[str, Any]:
        """Rounds of ``level`` streams with nothing to sweep, then the same while the
        sweeper works through ``expired`` expired responses of 20 events each (stored just
        before, so that the API's own sweeper has not taken them yet)."""
        pool = await asyncpg.create_pool(self.database_url, min_size=1, max_size=2)
        result: dict[str, Any] = {"expired_responses": expired, "streams": level}
        try:
            async with SseClient(self.steno_url, connections=level) as client:
                async def rounds_of_streams(label: str, until: asyncio.Task | None = None) -> list[dict[str, Any]]:
                    samples: list[dict[str, Any]] = []
                    for _ in range(rounds):
                        samples += await asyncio.gather(*(one_stream(client, f"{label} {i}")
                                                          for i in range(level)))
                        if until is not None and until.done():
                            break
                    return samples

                await rounds_of_streams("warm up")
                quiet = await rounds_of_streams("quiet")
                await pool.execute("""
                    INSERT INTO responses (id, tenant_id, model, status, background, store, request, parse_context,
                                           base_snapshot, created_at, expires_at)
                    SELECT 'resp_expired' || n, 'bench', 'm', 'completed', false, true, '{}', '{}', '{}',
                           now() - interval '2 days', now() - interval '1 day'
                    FROM generate_series(1, $1) AS n""", expired)
                await pool.execute("""
                    INSERT INTO response_events (response_id, seq, type, payload)
                    SELECT 'resp_expired' || n, seq, 'response.output_text.delta', repeat('x', 200)
                    FROM generate_series(1, $1) AS n, generate_series(0, 19) AS seq""", expired)
                started = time.perf_counter()
                sweep = asyncio.create_task(RetentionSweeper(pool, ResponseStore(pool)).sweep())
                sweeping = await rounds_of_streams("sweeping", until=sweep)
                swept = await sweep
                sweep_s = time.perf_counter() - started
        finally:
            await pool.close()
        for name, samples in (("quiet", quiet), ("sweeping", sweeping)):
            result[name] = _ttfe_summary(samples, {})
        result["sweep_s"] = sweep_s
        result["swept_responses"] = swept.responses
        print(f"retention: {swept.responses} of {expired} expired responses ({expired * 20} events) swept here in "
              f"{sweep_s:.1f} s (the API's own sweeper takes a share); first content at {level} streams p50/p99: "
              f"{result['quiet']['first_content_ms_p50']:.1f}/{result['quiet']['first_content_ms_p99']:.1f} ms with "
              f"nothing to sweep, {result['sweeping']['first_content_ms_p50']:.1f}/"
              f"{result['sweeping']['first_content_ms_p99']:.1f} ms while sweeping ({len(sweeping)} streams)",
              flush=True)
        return result

    async def storage(self) -> dict[str, Any]:
        """Bytes per event as the events of running and just-ended responses are kept (a
        row each), then as they are kept for good: everything ended is compacted here at
        once, as the sweep does a minute after a response ends, and the chunks' table is
        measured (the rows' table keeps its freed space for the rows to come). A run
        whose other scenarios stored too few events to measure makes its own first: a
        closed loop of short streams, round after round until it has stored enough."""
        conn = await asyncpg.connect(self.database_url)
        pool = await asyncpg.create_pool(self.database_url, min_size=1, max_size=1)
        try:
            for _ in range(STORAGE_LOAD_ROUNDS):
                if await conn.fetchval("SELECT count(*) FROM response_events") >= STORAGE_MIN_EVENTS:
                    break
                await self._closed_loop(self.steno_url, STORAGE_LOAD_STREAMS, STORAGE_LOAD_S)
            events = await conn.fetchval("SELECT count(*) FROM response_events")
            if events < STORAGE_MIN_EVENTS:
                raise RuntimeError(f"storage: {STORAGE_LOAD_ROUNDS} rounds of {STORAGE_LOAD_S:.0f} s stored only "
                                   f"{events} events of the {STORAGE_MIN_EVENTS} it measures")
            event_bytes = await conn.fetchval("SELECT pg_total_relation_size('response_events')")
            tokens = await conn.fetchval("SELECT coalesce(sum(cardinality(token_ids)), 0) FROM response_tokens")
            token_bytes = await conn.fetchval("SELECT pg_total_relation_size('response_tokens')")
            payload = await conn.fetchval("SELECT avg(octet_length(payload)) FROM response_events")
            store = ResponseStore(pool)
            while await store.compact_ended(COMPACT_BATCH, 0) == COMPACT_BATCH:
                pass
            compacted = await conn.fetchval("SELECT coalesce(sum(cardinality(types)), 0) FROM response_event_chunks")
            chunk_bytes = await conn.fetchval("SELECT pg_total_relation_size('response_event_chunks')")
        finally:
            await pool.close()
            await conn.close()
        result = {"events": events, "bytes_per_event": event_bytes / max(events, 1),
                  "avg_payload_bytes": float(payload or 0), "tokens": tokens,
                  "bytes_per_token": token_bytes / max(tokens, 1), "events_compacted": compacted,
                  "bytes_per_event_compacted": chunk_bytes / max(compacted, 1)}
        print(f"storage: {result['bytes_per_event']:.0f} bytes per event as rows, "
              f"{result['bytes_per_event_compacted']:.0f} compacted ({compacted} events) "
              f"(payload {result['avg_payload_bytes']:.0f}), "
              f"{result['bytes_per_token']:.1f} bytes per token (raw batches)", flush=True)
        return result


def chart(results: dict[str, Any], path: Path) -> bool:
    """Draws the ttfe and throughput scenarios, if the run had either; says whether it drew."""
    panels = [k for k in ("ttfe", "throughput") if k in results]
    if not panels:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for axis, panel in zip(axes[0], panels):
        levels = list(results[panel])
        if panel == "ttfe":
            for name, style in (("steno", "o-"), ("baseline", "s--")):
                axis.plot(levels, [results[panel][lv][name]["first_content_ms_p50"] for lv in levels], style,
                          label=f"{name} p50")
                axis.plot(levels, [results[panel][lv][name]["first_content_ms_p99"] for lv in levels], style,
                          alpha=.5, label=f"{name} p99")
            axis.set_ylabel("time to first content event (ms, log scale)")
            axis.set_yscale("log")
        else:
            for name, style in (("steno", "o-"), ("baseline", "s--")):
                axis.plot(levels, [results[panel][lv][name]["tokens_per_s"] for lv in levels], style, label=name)
            axis.set_ylabel("tokens/s end to end")
        axis.set_xlabel("concurrent streams")
        axis.set_title(panel)
        axis.legend()
        axis.grid(alpha=.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


async def run(args: argparse.Namespace) -> dict[str, Any]:
    scenarios = SCENARIOS if args.scenarios == "all" else args.scenarios.split(",")
    machine: dict[str, Any] = {"cpus": os.cpu_count(), "yardstick_ms": round(yardstick_ms(), 3)}
    print(f"machine: {machine['cpus']} cores, yardstick {machine['yardstick_ms']} ms (sum(range(100000)), best of 5)")
    results: dict[str, Any] = {"scenarios": scenarios, "machine": machine, "api_replicas": args.api_replicas,
                               "token_partitions": args.token_partitions}
    with tempfile.TemporaryDirectory(prefix="steno-bench-") as tmp:
        work = Path(tmp)
        if args.logs is not None:
            args.logs.mkdir(parents=True, exist_ok=True)
            work = args.logs
        bench = Bench(work, args.api_replicas, args.token_partitions)
        if args.profile:
            bench.profiler = Profiler(args.out / "profiles", args.profile_rate)
        try:
            await bench.start()
            servers = machine["servers"] = await bench.server_versions()
            print(f"servers: NATS {servers['nats']}, Postgres {servers['postgres']}")
            if "ttfe" in scenarios:
                results["ttfe"] = await bench.ttfe([int(x) for x in args.ttfe_levels.split(",")], args.ttfe_samples)
            if "throughput" in scenarios:
                results["throughput"] = await bench.throughput([int(x) for x in args.throughput_levels.split(",")],
                                                               args.seconds)
            if "parser" in scenarios:
                results["parser"] = await bench.parser(args.parser_responses, args.parser_batch_tokens,
                                                       args.parser_family)
            if "fanout" in scenarios:
                results["fanout"] = await bench.fanout(args.fanout_clients)
            if "replay" in scenarios:
                results["replay"] = await bench.replay(args.replay_events)
            if "storage" in scenarios:
                results["storage"] = await bench.storage()
            if "cancel" in scenarios:
                results["cancel"] = await bench.cancel(args.cancels)
            if "retention" in scenarios:
                results["retention"] = await bench.retention(args.retention_expired, 16, args.retention_rounds)
            if "affinity" in scenarios:
                results["affinity"] = await bench.affinity(args.affinity_workers, args.affinity_conversations,
                                                           args.affinity_turns)
            if "vllm" in scenarios:
                results["vllm"] = await side_by_side(bench, work, [int(x) for x in args.vllm_levels.split(",")],
                                                     args.vllm_max_tokens, args.vllm_rounds)
            if "steady" in scenarios:
                from steno.benchmarks.steady import steady  # it builds on this module

                results["steady"] = await steady(bench, [int(x) for x in args.steady_levels.split(",")],
                                                 args.steady_tokens, args.steady_rate, args.steady_limit_ms,
                                                 args.steady_max_streams, args.steady_batch_interval_ms)
        finally:
            await bench.stop()
    if bench.profiler is not None:
        results["profile_samples_per_s"] = bench.profiler.samples_per_s
        results["profiles"] = bench.profiler.results
    machine["yardstick_ms_after"] = round(yardstick_ms(), 3)
    print(f"machine: yardstick {machine['yardstick_ms_after']} ms after the run")
    return results


def main(args: argparse.Namespace) -> None:
    # The load generator shares the cores with what it measures: on the services' event
    # loop it spends less of them per delta (docs/performance.md).
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        results = runner.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    drawn = chart(results, args.out / "chart.png")
    print(f"wrote {args.out / 'results.json'}" + (f" and {args.out / 'chart.png'}" if drawn else ""))
    if "steady" in results:
        from steno.benchmarks import steady

        steady.chart(results["steady"], args.out / "steady.png")
        print(f"wrote {args.out / 'steady.png'}")
