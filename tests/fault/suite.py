"""The fault suite: kill anything mid-stream, lose nothing.

Starts a multi-replica Steno (2 API/edge, 2 workers, 2 parsers) on loopback, on a NATS
and a Postgres of its own, runs K concurrent streaming clients, injects one failure per
trial at a random point, and checks every stream: sequence numbers gapless from 0, no
duplicates, a terminal event, concatenated deltas == final text == stored snapshot,
and the log in Postgres identical to what the client saw. Prints a table with the
longest pause each stream saw (the largest gap between two events it received) and the
takeovers: partitions or affinity shards acquired from another holder and generation
requests taken up again, counted by the parsers' and workers' own metrics from the
failure on. "worker-freeze" and "parser-freeze" stop a process for longer than a stream
lasts and wake it; "worker-thaw" stops a worker past its ack wait and wakes it while its
streams go on elsewhere, and each attempt taken from it must stop as it wakes. Under
"cpu-hog" (a busy loop on every core for a few seconds, every process alive) a takeover
is a live process's work taken from it, and fails the trial.

    python -m tests.fault.suite                       # every failure, 3 trials, 16 streams
    python -m tests.fault.suite --trials 1 --streams 6 --failures worker,parser

Exit status 1 when any stream lost or duplicated an event or failed unexpectedly."""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
import nats
import orjson

from steno.infra.embedded import free_port
from steno.infra.processes import Stack, wait_healthy
from steno.schemas.bus import GenerationEnded, TokenBatch
from steno.services.common.bus import Names, partition_of
from steno.services.common.config import ApiSettings, Settings
from steno.services.common.migrate import ensure_database, upgrade
from tests.fault.infra import Nats, Postgres

FAILURES = ["worker", "parser", "api", "worker-freeze", "parser-freeze", "worker-thaw", "nats-restart", "nats-node",
            "postgres", "poison", "poisoned-output", "cpu-hog"]
# Failures that kill nothing: any takeover during them took work from a live process.
NOTHING_DIES = {"cpu-hog"}
# A process stopped (SIGSTOP: a paused host or container) for this long, then woken: its
# work goes on elsewhere meanwhile, and it must not spoil it on waking. Longer than any
# stream lasts; or ("worker-thaw") past the ack wait and woken mid-stream, when the worker
# must stop each attempt a later one took over.
FREEZES = {"worker-freeze": ("worker", 8.0), "parser-freeze": ("parser", 8.0), "worker-thaw": ("worker", 2.0)}
# The busy loop "cpu-hog" runs on every core, each process ending by itself.
HOG_S = 8.0
BUSY_LOOP = f"import time\nend = time.monotonic() + {HOG_S}\nwhile time.monotonic() < end:\n    pass\n"
# What the parsers and workers count when they take work over (services/common/metrics.py).
TAKEOVER_METRICS = ("steno_partitions_taken_over_total", "steno_work_redelivered_total")
MODEL = "steno-fault"
# The requests workers took up again, and the attempts they stopped because another
# worker took them up again.
ATTEMPT_METRICS = ("steno_work_redelivered_total",
                   f'steno_generations_total{{finish_reason="superseded",model="{MODEL}"}}')
# When a failure comes, in seconds after the clients start (the streams last about 4.5 s).
# A poisoned batch that breaks the parser fails its response on its fourth delivery,
# about 2 s after the first (the parser's retry backoff): injected later, it could see
# the stream end first, and then be a duplicate of an ended stream.
INJECTED_AFTER_S = {"poison": (0.2, 1.0)}
DEFAULT_INJECTED_AFTER_S = (1.0, 2.5)
TERMINAL = {"response.completed", "response.incomplete", "response.failed"}


@dataclass
class StreamRecord:
    response_id: str = ""
    events: list[tuple[int, str, str]] = field(default_factory=list)  # (seq, type, payload) as received
    arrivals: list[float] = field(default_factory=list)
    reconnects: int = 0
    error: str | None = None
    expected_text: str = ""


@dataclass
class TrialResult:
    failure: str
    streams: int = 0
    lost: int = 0
    duplicates: int = 0
    failed: int = 0
    mismatches: list[str] = field(default_factory=list)
    # Per stream, the largest gap between two consecutive events it received.
    longest_pause_s: list[float] = field(default_factory=list)
    takeovers: int = 0


async def stream_client(stack: Stack, index: int, rng: random.Random, deadline: float) -> StreamRecord:
    record = StreamRecord()
    prompt = f"stream {index}: " + " ".join(f"word{rng.randint(0, 999)}" for _ in range(60))
    # What the simulator answers: a stream that was restarted instead of continued would say it twice.
    record.expected_text = "Steno simulator reply: " + " ".join(prompt.split())[:400]
    async with httpx.AsyncClient(timeout=httpx.Timeout(60, connect=5)) as http:
        while not record.response_id:
            try:
                reply = await http.post(stack.url_of(rng.randrange(len(stack.api_ports))) + "/responses",
                                        headers=stack.headers(), json={"model": MODEL, "input": prompt,
                                                                       "background": True})
                reply.raise_for_status()
                record.response_id = reply.json()["id"]
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    record.error = "could not create"
                    return record
                await asyncio.sleep(0.2)
        while time.monotonic() < deadline:
            params = {"stream": "true"}
            if record.events:
                params["starting_after"] = str(record.events[-1][0])
            url = f"{stack.url_of(rng.randrange(len(stack.api_ports)))}/responses/{record.response_id}"
            try:
                # Keepalive comments keep a stalled stream open: the deadline ends it.
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())), \
                        http.stream("GET", url, params=params, headers=stack.headers()) as reply:
                    if reply.status_code != 200:
                        raise httpx.HTTPError(f"status {reply.status_code}")
                    async for line in reply.aiter_lines():
                        if not line.startswith("data: "):
                            continue
                        payload = line[6:]
                        event = orjson.loads(payload)
                        if event["type"] == "error" and event.get("code") == "stream_interrupted":
                            break  # the edge gave up on this connection: resume elsewhere
                        if event["type"] == "response.failed" and record.events and \
                                event["sequence_number"] == record.events[-1][0] + 2 and \
                                event["response"]["error"]["message"].startswith("The stream was interrupted"):
                            break
                        record.events.append((event["sequence_number"], event["type"], payload))
                        record.arrivals.append(time.monotonic())
                        if event["type"] in TERMINAL:
                            return record
            except (httpx.HTTPError, OSError):
                pass
            except TimeoutError:
                break
            record.reconnects += 1
            await asyncio.sleep(0.2)
    record.error = "no terminal event before the deadline"
    return record


async def poison(settings: Settings, response_id: str) -> None:
    """A batch no parser can digest (a token id that is not a token), as the first of a
    later attempt, so that it comes next wherever the live stream stands. It ends its
    attempt, as a worker's last batch does: the live attempt's batches that follow are
    duplicates of an earlier one, and an attempt that never ended would leave the
    response waiting for good."""
    names = Names.from_settings(settings)
    nc = await nats.connect(settings.nats_url.split(","))
    try:
        ended = GenerationEnded(response_id=response_id, attempt=1000, batch_count=1, finish_reason="stop",
                                prompt_tokens=0, output_tokens=1)
        batch = TokenBatch(response_id=response_id, attempt=1000, batch_no=0, token_ids=[-1], ended=ended)
        await nc.jetstream().publish(names.tokens_subject(response_id), batch.model_dump_json().encode())
    finally:
        await nc.close()


# What the injected responses of "poisoned-output" say, and how each must end.
NUL_TEXT = "a model may say \x00, too"
INJECTED = {"nul": ("completed", NUL_TEXT), "refused": ("failed", None)}


async def poisoned_output(settings: Settings, beside: str) -> dict[str, tuple[str, str | None]]:
    """Two responses in the token partition of a live one, streamed as a worker would: one
    whose output holds the byte-0 token (it must be stored like any text) and one whose
    write Postgres refuses (an attempt number beyond its integer column): that one must
    fail visibly, and neither may hold up the live responses beside them."""
    from tests.token_streams import create, publish_interleaved, stream_of

    partition = partition_of(beside, settings.token_partitions)
    ids: dict[str, str] = {}
    while len(ids) < len(INJECTED):
        rid = f"resp_poisoned{secrets.token_hex(12)}"
        if partition_of(rid, settings.token_partitions) == partition:
            ids[list(INJECTED)[len(ids)]] = rid
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=1)
    try:
        for rid in ids.values():
            await create(pool, rid, "injected", tenant="fault", model=MODEL)
    finally:
        await pool.close()
    await publish_interleaved(settings, [stream_of(ids["nul"], NUL_TEXT),
                                         stream_of(ids["refused"], "never stored", attempt=2**40)])
    return {rid: INJECTED[kind] for kind, rid in ids.items()}


async def inject(failure: str, stack: Stack, bus: Nats, pg: Postgres, records: list[StreamRecord],
                 rng: random.Random) -> str | dict[str, tuple[str, str | None]] | None:
    """Injects the failure; returns the id of a response expected to fail, or the
    responses it added with how each must end, if any."""
    env_stack = stack
    if failure in ("worker", "parser", "api"):
        victims = [p for p in env_stack.processes if p.name.startswith(failure)]
        victim = rng.choice(victims)
        victim.stop(sig=9)
        await asyncio.sleep(0.5)
        victim.start(_env(stack))
        if failure == "api":
            await asyncio.to_thread(wait_healthy, f"http://127.0.0.1:{victim.argv[-1]}", victim)
    elif failure in FREEZES:
        kind, frozen_s = FREEZES[failure]
        victim = rng.choice([p for p in env_stack.processes if p.name.startswith(kind)])
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(frozen_s)
        finally:
            os.kill(victim.pid, signal.SIGCONT)
    elif failure == "nats-restart":
        bus.nodes[0].stop()
        await asyncio.sleep(2)
        bus.nodes[0].start()
    elif failure == "nats-node":
        node = rng.choice(bus.nodes)
        node.stop(kill=True)
        await asyncio.sleep(5)
        node.start()
    elif failure == "postgres":
        await asyncio.to_thread(pg.stop)
        await asyncio.sleep(3)
        await asyncio.to_thread(pg.start)
    elif failure == "poison":
        target = next(r.response_id for r in records if r.response_id)
        await poison(stack.settings, target)
        return target
    elif failure == "poisoned-output":
        return await poisoned_output(stack.settings, next(r.response_id for r in records if r.response_id))
    elif failure == "cpu-hog":
        hogs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(os.cpu_count() or 1)]
        await asyncio.gather(*(asyncio.to_thread(hog.wait) for hog in hogs))
    return None


async def metric_sums(http: httpx.AsyncClient, metrics_ports: list[int],
                      metrics: tuple[str, ...] = TAKEOVER_METRICS) -> list[float]:
    """Each parser's and worker's samples of ``metrics`` (its takeovers, unless told)
    summed, read from its metrics endpoint (0 for one that does not answer: it was killed
    and is starting again)."""
    counts = []
    for port in metrics_ports:
        try:
            text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
        except httpx.HTTPError:
            counts.append(0.0)
            continue
        counts.append(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                          if line.startswith(metrics)))
    return counts


def increase(before: list[float], after: list[float]) -> int:
    """How much the counts grew; a process whose count went down was restarted: all it
    counts happened since."""
    return round(sum(a - b if a >= b else a for b, a in zip(before, after)))


def _env(stack: Stack) -> dict[str, str]:
    from steno.infra.processes import service_env

    return service_env(stack.settings)


async def check_injected(conn: asyncpg.Connection, injected: dict[str, tuple[str, str | None]],
                         result: TrialResult) -> None:
    for rid, (wanted, text) in injected.items():
        for _ in range(100):
            status = await conn.fetchval("SELECT status FROM responses WHERE id = $1", rid)
            if status in ("completed", "failed"):
                break
            await asyncio.sleep(0.1)
        if status != wanted:
            result.failed += 1
            result.mismatches.append(f"{rid}: injected to end {wanted}, but {status}")
            continue
        snapshot = orjson.loads(await conn.fetchval("SELECT snapshot::text FROM responses WHERE id = $1", rid))
        said = "".join(part["text"] for item in snapshot["output"] if item["type"] == "message"
                       for part in item["content"])
        if text is not None and said != text:
            result.mismatches.append(f"{rid}: stored {said!r}, not {text!r}")
        if wanted == "failed" and not snapshot.get("error"):
            result.mismatches.append(f"{rid}: failed without saying why")


async def check(stack: Stack, records: list[StreamRecord], expected: str | dict[str, tuple[str, str | None]] | None,
                result: TrialResult) -> None:
    expected_failure = expected if isinstance(expected, str) else None
    conn = await asyncpg.connect(stack.settings.database_url)
    try:
        if isinstance(expected, dict):
            await check_injected(conn, expected, result)
        for record in records:
            result.streams += 1
            if record.error:
                result.mismatches.append(f"{record.response_id or '?'}: {record.error}")
                result.failed += 1
                continue
            seqs = [seq for seq, _, _ in record.events]
            result.duplicates += len(seqs) - len(set(seqs))
            result.lost += (max(seqs) + 1 - len(set(seqs))) if seqs else 1
            if seqs[:1] != [0]:
                result.mismatches.append(f"{record.response_id}: first event {seqs[:1]}")
            terminal = orjson.loads(record.events[-1][2])
            status = terminal["response"]["status"]
            if record.response_id == expected_failure:
                if status != "failed":
                    result.mismatches.append(f"{record.response_id}: poisoned but {status}")
            elif status != "completed":
                result.failed += 1
                result.mismatches.append(f"{record.response_id}: {status} {terminal['response'].get('error')}")
            deltas = "".join(orjson.loads(p)["delta"] for _, t, p in record.events if t == "response.output_text.delta")
            final_text = "".join(part["text"] for item in terminal["response"]["output"] if item["type"] == "message"
                                 for part in item["content"])
            stored = await conn.fetchval("SELECT snapshot::text FROM responses WHERE id = $1", record.response_id)
            stored_text = "".join(part["text"] for item in orjson.loads(stored)["output"] if item["type"] == "message"
                                  for part in item["content"]) if stored else None
            if status == "completed" and not (deltas == final_text == stored_text == record.expected_text):
                result.mismatches.append(f"{record.response_id}: deltas/final/stored/expected text differ")
            rows = await conn.fetch(
                "SELECT seq, type, payload FROM response_log WHERE response_id = $1 ORDER BY seq",
                                    record.response_id)
            if [tuple(r) for r in rows] != record.events:
                result.mismatches.append(f"{record.response_id}: the stored log differs from what the client saw")
            gaps = [b - a for a, b in zip(record.arrivals, record.arrivals[1:])]
            result.longest_pause_s.append(max(gaps, default=0.0))
    finally:
        await conn.close()


async def run_trial(failure: str, trial: int, streams: int, work: Path, pg: Postgres, single: Nats | None,
                    rng: random.Random, tokens_per_s: float) -> TrialResult:
    bus = Nats(work / f"cluster-{trial}", nodes=3) if failure == "nats-node" else single
    run_id = f"f{secrets.token_hex(3)}"
    database_url = pg.url(f"steno_{run_id}")
    await ensure_database(database_url)
    await asyncio.to_thread(upgrade, database_url)
    settings = ApiSettings(nats_url=bus.url, database_url=database_url, namespace=run_id, token_partitions=8,
                        stream_replicas=bus.replicas)
    logs = work / f"logs-{run_id}"
    logs.mkdir()
    stack = Stack(settings, logs)
    result = TrialResult(failure)
    try:
        stack.create_key("fault")
        stack.keys["a"] = stack.keys["fault"]
        metrics_ports = [free_port() for _ in range(4)]
        for i in range(2):
            stack.add(f"parser-{i}", "parser", "--metrics-port", str(metrics_ports[2 * i]))
            stack.add(f"worker-{i}", "worker", "--model", MODEL, "--sim-tokens-per-s", str(tokens_per_s),
                      "--metrics-port", str(metrics_ports[2 * i + 1]))
        for _ in range(2):
            stack.add_api()
        await asyncio.sleep(3)  # parsers settle their partition shares
        deadline = time.monotonic() + 150
        clients = [asyncio.create_task(stream_client(stack, i, random.Random(rng.random()), deadline))
                   for i in range(streams)]
        await asyncio.sleep(rng.uniform(*INJECTED_AFTER_S.get(failure, DEFAULT_INJECTED_AFTER_S)))
        records_so_far = []
        while not records_so_far:
            await asyncio.sleep(0.1)
            records_so_far = [StreamRecord(response_id=r) for r in await _created(settings)]
        async with httpx.AsyncClient(timeout=5) as http:
            counted_before = await metric_sums(http, metrics_ports)
            attempts_before = [await metric_sums(http, metrics_ports, (metric,)) for metric in ATTEMPT_METRICS]
            expected = await inject(failure, stack, bus, pg, records_so_far, rng)
            records = await asyncio.gather(*clients)
            result.takeovers = increase(counted_before, await metric_sums(http, metrics_ports))
            redelivered, superseded = [increase(before, await metric_sums(http, metrics_ports, (metric,)))
                                       for before, metric in zip(attempts_before, ATTEMPT_METRICS, strict=True)]
        if failure in NOTHING_DIES and result.takeovers:
            result.mismatches.append(f"{result.takeovers} takeovers of work from live processes")
        if failure == "worker-thaw" and superseded != redelivered:
            result.mismatches.append(f"{redelivered} requests taken over from the thawed worker, {superseded} of its "
                                     "attempts stopped")
        await check(stack, records, expected, result)
    finally:
        stack.stop()
        if failure == "nats-node":
            bus.stop()
    return result


async def _created(settings: Settings) -> list[str]:
    conn = await asyncpg.connect(settings.database_url)
    try:
        return [r[0] for r in await conn.fetch("SELECT id FROM responses WHERE status = 'in_progress'")]
    finally:
        await conn.close()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(results: dict[str, list[TrialResult]]) -> str:
    lines = [f"{'failure':<16} {'trials':>6} {'streams':>7} {'lost':>5} {'dup':>5} {'failed':>6} "
             f"{'takeovers':>9} {'longest pause p50':>17} {'p99':>7} {'max':>7}"]
    for failure, trials in results.items():
        pauses = [p for t in trials for p in t.longest_pause_s]
        lines.append(
            f"{failure:<16} {len(trials):>6} {sum(t.streams for t in trials):>7} {sum(t.lost for t in trials):>5} "
            f"{sum(t.duplicates for t in trials):>5} {sum(t.failed for t in trials):>6} "
            f"{sum(t.takeovers for t in trials):>9} {percentile(pauses, 0.5):>16.2f}s "
            f"{percentile(pauses, 0.99):>6.2f}s {max(pauses, default=0.0):>6.2f}s"
        )
    return "\n".join(lines)


async def run(failures: list[str], trials: int, streams: int, seed: int, tokens_per_s: float) -> dict:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="steno-fault-") as tmp:
        work = Path(tmp)
        pg = Postgres(work / "pg")
        single = Nats(work / "nats") if any(f != "nats-node" for f in failures) else None
        results: dict[str, list[TrialResult]] = {}
        try:
            for failure in failures:
                for trial in range(trials):
                    result = await run_trial(failure, trial, streams, work, pg, single, rng, tokens_per_s)
                    results.setdefault(failure, []).append(result)
                    for mismatch in result.mismatches:
                        print(f"  {failure} trial {trial}: {mismatch}", file=sys.stderr)
        finally:
            if single is not None:
                single.stop()
            pg.close()
        return results


def healthy(results: dict[str, list[TrialResult]]) -> bool:
    return all(not t.lost and not t.duplicates and not t.failed and not t.mismatches
               for trials in results.values() for t in trials)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--failures", default=",".join(FAILURES))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tokens-per-s", type=float, default=30.0, help="simulator speed (streams last longer)")
    args = parser.parse_args()
    failures = [f for f in args.failures.split(",") if f]
    unknown = set(failures) - set(FAILURES)
    if unknown:
        parser.error(f"unknown failures: {', '.join(sorted(unknown))}")
    started = time.monotonic()
    results = asyncio.run(run(failures, args.trials, args.streams, args.seed, args.tokens_per_s))
    print(table(results))
    print(f"({time.monotonic() - started:.0f}s)")
    sys.exit(0 if healthy(results) else 1)


if __name__ == "__main__":
    main()
