"""``steno bench --scenarios steady``: long streams at a steady rate, the way real
responses arrive: N concurrent streams of ``tokens``-token responses at ``rate`` tokens/s
each (1,000 tokens at 50 tokens/s by default: 20 s a stream), Steno and the baseline side
by side, started over one second as independent clients would. The simulator, like a
batched engine, gives every running stream its next token on one step clock.

Added latency per delta: when a content delta (any ``response.*.delta`` event) reached
the client, against when the engine emitted the first token of the batch that produced
it, the token that waited longest. Steno's batches are read off the bus (a core NATS
subscription to the namespace's token subjects sees every batch a worker publishes) with
``TokenBatch.first_emitted_at``, the worker's clock when the batch's first token was
emitted (from a worker that stamps only the last, ``emitted_at``); a batch with neither
counts from when it reached the bus, which leaves the worker's coalescing out.
The baseline records the same for each of its engine's outputs (``--record-emissions``)
and hands them out per response. Both clocks are this machine's wall clock.

Matching a delta to its batch: the bench splits each response's batches with the
dialect's own splitter, as the parser does, which gives the content characters out
after each batch; the client adds up its deltas' characters. A delta came from the first
batch after which that much content was out (text the splitter held back until a later
token goes with the batch that released it, as in the parser). This needs no token
counting on the client and holds however batches and deltas are cut.

Where Steno's added latency goes, per delta, by the same matching: from the emission to
the batch reaching the bus (the worker), from there to the announcement of its events on
core NATS after their commit (the parser, Postgres included), and from there to the
client (the edge). The announcements are matched to deltas by content characters too.

Per level it reports added latency p50/p99/max and its stages, CPU seconds per 1,000 tokens of each
process, and what Steno wrote to Postgres (event and token rows, the database's growth,
and WAL bytes, the latter for the whole server). Then, while the largest level's added
p99 stays under the limit, it doubles the streams (Steno alone), and bisects once
between the last level under and the first over, up to ``max_streams``: the largest N
held is the largest level under the limit below the first one over it.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
from nats.aio.msg import Msg

from steno.benchmarks.harness import Bench, collector_paused, cpu_seconds, group_cpu_seconds, pct
from steno.benchmarks.sse_client import HttpError, SseClient
from steno.infra.embedded import free_port
from steno.schemas.bus import TokenBatch, token_partition_message, unpacked
from steno.schemas.responses import ParseContext
from steno.services.common.bus import connect
from steno.services.dialects import DEFAULT_DIALECT, CompletionSplitter, TextDelta, dialect_named

STEADY_MODEL = "steno-steady"
# Streams start spread over this long, as independent clients would.
START_SPREAD_S = 1.0
# A stream that takes this many times its ideal length is counted as failed.
STREAM_TIMEOUT_FACTOR = 4
# A bisection step stops when the gap between the level under and the level over is
# smaller than this share of the level under.
SEARCH_RESOLUTION = 0.25
WRITES = """SELECT (SELECT count(*) FROM response_log), (SELECT count(*) FROM response_tokens),
                   pg_database_size(current_database()), pg_current_wal_lsn()"""


# A completed reply: its response id and content deltas (arrival on the wall clock, text).
Reply = tuple[str, list[tuple[float, str]]]


@dataclass(frozen=True)
class Emission:
    """A batch of one response's tokens, when the engine emitted its last token, and when
    it reached the bus (None where there is no bus: the baseline)."""

    at: float
    token_ids: Sequence[int]
    on_bus: float | None = None


@dataclass(frozen=True)
class Announcements:
    """When a response's events were announced, each time with the content characters
    announced through it."""

    at: list[float]
    marks: list[int]


def content_marks(splitter: CompletionSplitter, emissions: Sequence[Emission]) -> list[int]:
    """Content characters out after each batch, in order (what ``finish`` releases at the
    end goes with the last batch)."""
    marks, total = [], 0
    for emission in emissions:
        total += sum(len(f.text) for f in splitter.feed(emission.token_ids) if isinstance(f, TextDelta))
        marks.append(total)
    if marks:
        marks[-1] += sum(len(f.text) for f in splitter.finish() if isinstance(f, TextDelta))
    return marks


def added_latencies_ms(emissions: Sequence[Emission], marks: Sequence[int],
                       deltas: Sequence[tuple[float, str]]) -> tuple[list[tuple[float, float]], int]:
    """Each delta's arrival (wall clock, with its text) against the emission of the batch
    that produced it, as (that emission, milliseconds added); also how many deltas went
    beyond every batch's content (unmatched)."""
    latencies, seen, unmatched = [], 0, 0
    for arrived, text in deltas:
        seen += len(text)
        batch = bisect.bisect_left(marks, seen)
        if batch == len(marks):
            unmatched += 1
        else:
            emitted = emissions[batch].at
            latencies.append((emitted, (arrived - emitted) * 1000))
    return latencies, unmatched


def all_running(emissions: dict[str, list[Emission]]) -> tuple[float, float] | None:
    """From the last stream's first emission to the first stream's last: the span in
    which every stream of the level was running, away from the starts and the ends that
    bunch at its edges (its streams start within ``START_SPREAD_S`` and end as close)."""
    spans = [(batches[0].at, batches[-1].at) for batches in emissions.values() if batches]
    if not spans:
        return None
    start, end = max(first for first, _ in spans), min(last for _, last in spans)
    return (start, end) if start < end else None


def stage_latencies_ms(emissions: Sequence[Emission], marks: Sequence[int], announced: Announcements,
                       deltas: Sequence[tuple[float, str]]) -> dict[str, list[float]]:
    """Each matched delta's time from emission to the bus (worker), from the bus to the
    announcement that carried it (parser) and from there to the client (edge)."""
    stages: dict[str, list[float]] = {"worker": [], "parser": [], "edge": []}
    seen = 0
    for arrived, text in deltas:
        seen += len(text)
        batch, announcement = bisect.bisect_left(marks, seen), bisect.bisect_left(announced.marks, seen)
        if batch == len(marks) or announcement == len(announced.marks):
            continue
        on_bus, announced_at = emissions[batch].on_bus, announced.at[announcement]
        if on_bus is None:
            continue
        stages["worker"].append((on_bus - emissions[batch].at) * 1000)
        stages["parser"].append((announced_at - on_bus) * 1000)
        stages["edge"].append((arrived - announced_at) * 1000)
    return stages


def summary_ms(values: Sequence[float]) -> dict[str, float]:
    return {"p50": pct(list(values), .5), "p99": pct(list(values), .99),
            "max": max(values, default=float("nan"))}


def next_level(p99_by_level: dict[int, float], limit_ms: float, max_streams: int) -> int | None:
    """The next level to measure: double the largest while every level is under the
    limit, then bisect between the largest under and the smallest over; None when the
    answer is found to ``SEARCH_RESOLUTION`` or ``max_streams`` is reached."""
    over = [level for level, p99 in p99_by_level.items() if not p99 < limit_ms]
    if not over:
        top = max(p99_by_level)
        return min(2 * top, max_streams) if top < max_streams else None
    held = largest_held(p99_by_level, limit_ms)
    if held is None:
        return None
    first_over = min(over)
    return (held + first_over) // 2 if first_over - held > held * SEARCH_RESOLUTION else None


def largest_held(p99_by_level: dict[int, float], limit_ms: float) -> int | None:
    """The largest level under the limit below the first level over it (None if none is)."""
    first_over = min((level for level, p99 in p99_by_level.items() if not p99 < limit_ms), default=None)
    held = [level for level, p99 in p99_by_level.items()
            if p99 < limit_ms and (first_over is None or level < first_over)]
    return max(held, default=None)


def delta_frames(frames: Sequence[tuple[float, bytes]], wall_offset: float) -> Reply:
    """A reply's response id and its content deltas, each with its arrival on the wall clock."""
    response_id = orjson.loads(frames[0][1])["response"]["id"]
    deltas = []
    for arrived, data in frames:
        if b'.delta"' in data[:60]:
            event = orjson.loads(data)
            if isinstance(event.get("delta"), str):
                deltas.append((arrived + wall_offset, event["delta"]))
    return response_id, deltas


class BatchFollower:
    """Every token batch a worker publishes in the namespace, kept raw with when it came
    (parsed after the level, off the measured path)."""

    def __init__(self) -> None:
        self.received: list[tuple[float, bytes]] = []

    async def on_message(self, msg: Msg) -> None:
        self.received.append((time.time(), msg.data))

    async def quiet(self, for_s: float, at_most_s: float) -> None:
        """Waits until no batch has come for ``for_s`` (at most ``at_most_s``): the work of
        streams that ended early (or failed) has drained before the next level."""
        deadline = time.time() + at_most_s
        while time.time() < deadline and self.received and time.time() - self.received[-1][0] < for_s:
            await asyncio.sleep(for_s / 4)

    def take(self) -> tuple[dict[str, list[Emission]], int, int]:
        """Batches by response (in order, redeliveries once) and how many batches there
        were and how many carried their emission time."""
        by_response: dict[str, dict[tuple[int, int], Emission]] = {}
        batches = stamped = 0
        for observed_at, data in self.received:
            for message, _ in unpacked(token_partition_message.validate_json(data), None):
                if not isinstance(message, TokenBatch) or not message.token_ids:
                    continue
                batches += 1
                # The batch's first token waited longest; a worker that stamps only the last
                # (before first_emitted_at) is measured from that.
                emitted_at = message.first_emitted_at or message.emitted_at
                stamped += emitted_at is not None
                at = emitted_at or observed_at
                by_response.setdefault(message.response_id, {}).setdefault(
                    (message.attempt, message.batch_no), Emission(at, message.token_ids, on_bus=observed_at))
        self.received = []
        ordered = {rid: [numbered[key] for key in sorted(numbered)] for rid, numbered in by_response.items()}
        return ordered, batches, stamped


class AnnouncementFollower(BatchFollower):
    """Every announcement of committed events in the namespace, with when it came."""

    def take_announcements(self) -> dict[str, Announcements]:
        by_response: dict[str, Announcements] = {}
        for observed_at, data in self.received:
            for message in orjson.loads(data)["committed"]:
                content = 0
                for event in message["events"]:
                    if event["type"].endswith(".delta"):
                        delta = orjson.loads(event["payload"]).get("delta")
                        content += len(delta) if isinstance(delta, str) else 0
                if content:
                    announced = by_response.setdefault(message["response_id"], Announcements([], []))
                    announced.at.append(observed_at)
                    announced.marks.append((announced.marks[-1] if announced.marks else 0) + content)
        self.received = []
        return by_response


async def _streams(url: str, level: int, timeout_s: float) -> tuple[list[Reply], dict[str, int], float]:
    """``level`` streams started over ``START_SPREAD_S``: each completed reply's id and
    deltas, the other streams by how they ended (a stream not done in ``timeout_s``
    failed), and the slowest stream's seconds."""
    wall_offset = time.time() - time.perf_counter()
    durations: list[float] = []
    failures: Counter[str] = Counter()

    async def one(client: SseClient, i: int) -> Reply | None:
        await asyncio.sleep(i * START_SPREAD_S / level)
        started = time.perf_counter()
        try:
            body = {"model": STEADY_MODEL, "input": f"steady {i} of {level}", "stream": True}
            reply = await asyncio.wait_for(client.post_stream("/v1/responses", body), timeout_s)
        except HttpError as exc:
            failures[str(exc)] += 1
            return None
        except TimeoutError:
            failures["timed out"] += 1
            return None
        durations.append(time.perf_counter() - started)
        ended = orjson.loads(reply.frames[-1][1])["type"] if reply.frames else "no events"
        if ended != "response.completed":
            failures[ended] += 1
            return None
        return delta_frames(reply.frames, wall_offset)

    async with SseClient(url, connections=level) as client:
        with collector_paused():
            replies = await asyncio.gather(*(one(client, i) for i in range(level)))
    return [reply for reply in replies if reply is not None], dict(failures), max(durations, default=float("nan"))


def _side_result(replies: list[Reply], emissions: dict[str, list[Emission]],
                 errors: dict[str, int], slowest_s: float, cpu: dict[str, float],
                 announcements: dict[str, Announcements] | None = None) -> dict[str, Any]:
    dialect = dialect_named(DEFAULT_DIALECT)
    latencies: list[tuple[float, float]] = []
    stages: dict[str, list[float]] = {}
    unmatched = deltas = 0
    for response_id, response_deltas in replies:
        batches = emissions.get(response_id, [])
        marks = content_marks(dialect.splitter(ParseContext()), batches)
        measured, missed = added_latencies_ms(batches, marks, response_deltas)
        latencies += measured
        unmatched += missed
        deltas += len(response_deltas)
        if announcements is not None:
            announced = announcements.get(response_id, Announcements([], []))
            for stage, values in stage_latencies_ms(batches, marks, announced, response_deltas).items():
                stages.setdefault(stage, []).extend(values)
    tokens = sum(len(e.token_ids) for batches in emissions.values() for e in batches)
    window = all_running({response_id: emissions.get(response_id, []) for response_id, _ in replies})
    running = [added for emitted, added in latencies if window and window[0] <= emitted <= window[1]]
    return {"streams": len(replies), "errors": errors, "deltas": deltas, "unmatched_deltas": unmatched,
            "tokens": tokens, "slowest_stream_s": round(slowest_s, 2),
            "added_ms": summary_ms([added for _, added in latencies]),
            "all_running_s": round(window[1] - window[0], 2) if window else 0.0,
            "added_ms_all_running": summary_ms(running),
            **({"stages_ms": {stage: summary_ms(values) for stage, values in stages.items()}} if stages else {}),
            "cpu_s_per_1k_tokens": {name: round(used * 1000 / max(tokens, 1), 4)
                                    for name, used in cpu.items() if used > 0}}


async def _postgres_writes(conn: asyncpg.Connection) -> list[Any]:
    """Event rows, token rows, the database's size, and the server's WAL position."""
    return list(await conn.fetchrow(WRITES) or ())


async def _steno_level(bench: Bench, follower: BatchFollower, announcements: AnnouncementFollower,
                       conn: asyncpg.Connection, level: int, timeout_s: float) -> dict[str, Any]:
    # The stack's other workers serve other scenarios' models and idle here.
    serving = bench.serving("worker-steady")
    pids = {name: pid for name, pid in bench.pids().items() if name in serving}

    def cpu() -> dict[str, float]:
        used = {name: cpu_seconds(pid) for name, pid in pids.items()}
        used.update({command: group_cpu_seconds(command) for command in ("postgres", "nats-server")})
        used["client"] = time.process_time()
        return used

    writes_before, cpu_before = await _postgres_writes(conn), cpu()
    async with bench.profiled(f"steady-{level}", serving):
        replies, errors, slowest = await _streams(bench.steno_url, level, timeout_s)
    await follower.quiet(1.0, timeout_s)  # the last batches are in, the last commits landed
    cpu_after, writes_after = cpu(), await _postgres_writes(conn)
    emissions, batches, stamped = follower.take()
    result = _side_result(replies, emissions, errors, slowest,
                          {name: cpu_after[name] - cpu_before[name] for name in cpu_before},
                          announcements.take_announcements())
    wal = await conn.fetchval("SELECT pg_wal_lsn_diff($1, $2)", writes_after[3], writes_before[3])
    per_1k = 1000 / max(result["tokens"], 1)
    result["batches"] = batches
    result["batches_with_emission_time"] = stamped
    result["postgres"] = {"event_rows": writes_after[0] - writes_before[0],
                          "token_rows": writes_after[1] - writes_before[1],
                          "database_growth_bytes": writes_after[2] - writes_before[2],
                          "wal_bytes_whole_server": int(wal)}
    result["postgres_per_1k_tokens"] = {name: round(value * per_1k, 1) for name, value in result["postgres"].items()}
    return result


async def _baseline_level(url: str, pid: int, level: int, timeout_s: float) -> dict[str, Any]:
    cpu_before, client_before = cpu_seconds(pid), time.process_time()
    replies, errors, slowest = await _streams(url, level, timeout_s)
    cpu = {"baseline": cpu_seconds(pid) - cpu_before, "client": time.process_time() - client_before}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        emissions = {rid: [Emission(at, ids) for at, ids in (await http.get(f"/emissions/{rid}")).json()]
                     for rid, _ in replies}
    return _side_result(replies, emissions, errors, slowest, cpu)


def _line(name: str, level: int, side: dict[str, Any]) -> str:
    added, running = side["added_ms"], side["added_ms_all_running"]
    return (f"steady {level:>5} streams {name:>8}: added per delta p50 {added['p50']:.1f} ms p99 {added['p99']:.1f} ms "
            f"max {added['max']:.1f} ms (while all {level} ran, {side['all_running_s']} s: "
            f"p50 {running['p50']:.1f} ms p99 {running['p99']:.1f} ms) | "
            f"{side['deltas']} deltas ({side['unmatched_deltas']} unmatched), "
            f"{side['tokens']} tokens, {side['streams']} completed, failed {side['errors']}, "
            f"slowest stream {side['slowest_stream_s']} s | "
            f"CPU s per 1k tokens {side['cpu_s_per_1k_tokens']}"
            + "".join(f" | {stage} p50 {times['p50']:.1f} ms p99 {times['p99']:.1f} ms"
                      for stage, times in side.get("stages_ms", {}).items()))


async def steady(bench: Bench, levels: list[int], tokens: int, rate: float, limit_ms: float,
                 max_streams: int, batch_interval_ms: float) -> dict[str, Any]:
    bench.stack.add("worker-steady", "worker", "--model", STEADY_MODEL, "--sim-tokens-per-s", str(rate),
                    "--sim-answer-tokens", str(tokens), "--concurrency", str(max(max_streams, *levels)),
                    "--batch-interval-ms", str(batch_interval_ms))
    port = free_port()
    baseline = await bench.start_baseline("baseline-steady", port, "--sim-tokens-per-s", str(rate),
                                          "--sim-answer-tokens", str(tokens), "--record-emissions")
    follower, announcements = BatchFollower(), AnnouncementFollower()
    nc = await connect(bench.settings, "steno-bench-steady")
    conn = await asyncpg.connect(bench.database_url)
    out: dict[str, Any] = {"tokens": tokens, "tokens_per_s": rate, "limit_ms": limit_ms,
                           "batch_interval_ms": batch_interval_ms, "levels": {}}
    try:
        await nc.subscribe(f"{bench.settings.namespace}.tokens.>", cb=follower.on_message)
        await nc.subscribe(f"{bench.settings.namespace}.events.>", cb=announcements.on_message)
        await asyncio.sleep(5)  # the worker has registered its model
        baseline_url = f"http://127.0.0.1:{port}"
        # A stream far behind its rate has failed to keep it; the level still ends.
        timeout_s = STREAM_TIMEOUT_FACTOR * tokens / rate + START_SPREAD_S
        pending = list(levels)
        while pending:
            level = pending.pop(0)
            row: dict[str, Any] = {"steno": await _steno_level(bench, follower, announcements, conn, level,
                                                               timeout_s)}
            print(_line("steno", level, row["steno"]), flush=True)
            if level in levels:  # the search's levels measure Steno alone
                row["baseline"] = await _baseline_level(baseline_url, baseline.pid, level, timeout_s)
                print(_line("baseline", level, row["baseline"]), flush=True)
            out["levels"][str(level)] = row
            p99s = {int(n): r["steno"]["added_ms"]["p99"] for n, r in out["levels"].items()}
            following = next_level(p99s, limit_ms, max_streams) if not pending else None
            if following is not None and following not in p99s:
                pending.append(following)
    finally:
        await conn.close()
        await nc.close()
        baseline.stop(timeout_s=10)
    p99s = {int(n): r["steno"]["added_ms"]["p99"] for n, r in out["levels"].items()}
    out["largest_streams_under_limit"] = largest_held(p99s, limit_ms)
    print(f"steady: largest N with added p99 under {limit_ms:.0f} ms: {out['largest_streams_under_limit']} "
          f"(measured {sorted(p99s)}, at most {max_streams})", flush=True)
    return out


def chart(result: dict[str, Any], path: Path) -> None:
    """Added latency per delta by streams, p50 and p99 of both sides, and the limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(7, 4.5))
    levels = sorted(result["levels"], key=int)
    for name, style, color in (("steno", "o-", "C0"), ("baseline", "s--", "C1")):
        shown = [lv for lv in levels if name in result["levels"][lv]]
        for q, alpha in (("p50", 1.0), ("p99", .5)):
            axis.plot([int(lv) for lv in shown], [result["levels"][lv][name]["added_ms"][q] for lv in shown], style,
                      color=color, alpha=alpha, label=f"{name} {q}")
    axis.axhline(result["limit_ms"], color="grey", linestyle=":", label=f"{result['limit_ms']:.0f} ms")
    axis.set_xscale("log", base=2)
    axis.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axis.set_yscale("log")
    axis.set_xlabel(f"concurrent streams ({result['tokens']} tokens at {result['tokens_per_s']:.0f} tokens/s each)")
    axis.set_ylabel("added latency per delta (ms, log scale)")
    axis.set_title("steady: delta arrival against engine emission")
    axis.legend()
    axis.grid(alpha=.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
