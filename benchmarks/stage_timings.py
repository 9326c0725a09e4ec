"""Where a request's time goes: requests against a bench stack, with an observer on the
bus noting when each response was queued for a worker, when its first and last token
batches were published and when its events were first and last announced, beside the
client's own times for ``response.created``, the first content and the stream's end.

    python -m steno.benchmarks.stage_timings [--streams 16] [--rounds 30] [--nice parser=-10,worker=-5]
    python -m steno.benchmarks.stage_timings --closed-loop [--streams 32] [--seconds 10]

Bursts (the default) send ``--streams`` requests at once, ``--rounds`` times, and time
each step from the burst's sending; ``--closed-loop`` keeps ``--streams`` clients each
sending its next request when the last one ended (the throughput scenario's load) and
times each step from the request's own sending. Prints, per step, the p10 / p50 / p90
and the mean of those milliseconds; in a closed loop the means of consecutive steps
differ by what the stage between them added."""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
from nats.aio.msg import Msg

from steno.benchmarks.harness import CONTENT_EVENTS, MODEL, Bench, pct
from steno.benchmarks.sse_client import SseClient
from steno.schemas.bus import token_partition_message, unpacked
from steno.services.common.bus import connect

# In the order a request usually reaches them.
STEPS = ("queued", "created", "batch", "last batch", "announced", "content", "last announced", "done")
# Bursts of short responses: a response's few batches come close together, and its
# first content waits for them, so only the first of each is reported.
BURST_STEPS = ("queued", "created", "batch", "announced", "content")
# Requests of the first seconds of a closed loop, or of the first bursts, are not timed:
# they meet a stack that is still warming (connections, plans, caches).
WARM_ROUNDS = 3
WARM_S = 3.0
# What the observer may still receive after the client saw a request end.
SETTLE_S = 0.05


class BusObserver:
    """When each response's messages crossed the bus (perf_counter), the first and the
    last of each kind. One subscription for the namespace's subjects: its messages are
    handled in the order the server sent them, so the times of one response's steps keep
    the order the pipeline took them in (subscriptions of their own would each deliver
    in a task of its own, and steps close together could be noted the wrong way round)."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, float]] = {}
        self._handlers = {"gen": self.on_queued, "tokens": self.on_batch, "events": self.on_announced}

    async def on_message(self, msg: Msg) -> None:
        kind = msg.subject.split(".", 2)[1]
        handler = self._handlers.get(kind)
        if handler is not None:
            await handler(msg)

    def mark(self, response_id: str | None, step: str, last_step: str | None = None) -> None:
        if not response_id:
            return
        now = time.perf_counter()
        times = self.seen.setdefault(response_id, {})
        times.setdefault(step, now)
        if last_step is not None:
            times[last_step] = now

    async def on_queued(self, msg: Msg) -> None:
        self.mark((msg.headers or {}).get("Nats-Msg-Id"), "queued")

    async def on_batch(self, msg: Msg) -> None:
        for message, _ in unpacked(token_partition_message.validate_json(msg.data), None):
            self.mark(message.response_id, "batch", "last batch")

    async def on_announced(self, msg: Msg) -> None:
        for committed in orjson.loads(msg.data)["committed"]:
            self.mark(committed["response_id"], "announced", "last announced")


Request = Callable[[int], Awaitable[tuple[float, str, dict[str, float]]]]


async def measure(streams: int, nice: dict[str, int], *, rounds: int = 0,
                  closed_loop_s: float | None = None) -> dict[str, list[float]]:
    """Milliseconds from each timed request's sending (a burst's, in bursts) to each
    step, per step; a step a request did not reach (or the observer missed) is left out."""
    bench = Bench(Path(tempfile.mkdtemp(prefix="steno-stages-")))
    await bench.start()
    try:
        for name, value in nice.items():
            os.setpriority(os.PRIO_PROCESS, bench.pids()[name], value)
        namespace = bench.settings.namespace
        nc = await connect(bench.settings, "stage-observer")
        observer = BusObserver()
        await nc.subscribe(f"{namespace}.>", cb=observer.on_message)
        await nc.flush()
        async with SseClient(bench.steno_url, connections=streams) as client:

            async def request(i: int) -> tuple[float, str, dict[str, float]]:
                sent = time.perf_counter()
                frames = (await client.post_stream("/v1/responses", {"model": MODEL, "input": f"stages {i}",
                                                                     "stream": True})).frames
                response_id = orjson.loads(frames[0][1])["response"]["id"]
                content = next(at for at, data in frames if any(kind in data[:60] for kind in CONTENT_EVENTS))
                return sent, response_id, {"created": frames[0][0], "content": content, "done": frames[-1][0]}

            if closed_loop_s is None:
                after_send = await _bursts(request, observer, streams, rounds)
            else:
                after_send = await _closed_loop(request, observer, streams, closed_loop_s)
        await nc.close()
        return after_send
    finally:
        await bench.stop()


async def _bursts(request: Request, observer: BusObserver, streams: int, rounds: int) -> dict[str, list[float]]:
    after_send: dict[str, list[float]] = {step: [] for step in BURST_STEPS}
    for _ in range(WARM_ROUNDS):
        await asyncio.gather(*(request(i) for i in range(streams)))
    for _ in range(rounds):
        burst = await asyncio.gather(*(request(i) for i in range(streams)))
        start = min(sent for sent, *_ in burst)
        await asyncio.sleep(SETTLE_S)
        for _, response_id, at_client in burst:
            _add(after_send, start, {**observer.seen.get(response_id, {}), **at_client})
    return after_send


async def _closed_loop(request: Request, observer: BusObserver, streams: int,
                       seconds: float) -> dict[str, list[float]]:
    timed: list[tuple[float, str, dict[str, float]]] = []

    async def client(i: int, until: float, keep: bool) -> None:
        while time.perf_counter() < until:
            done = await request(i)
            if keep:
                timed.append(done)

    for duration, keep in ((WARM_S, False), (seconds, True)):
        until = time.perf_counter() + duration
        await asyncio.gather(*(client(i, until, keep) for i in range(streams)))
    await asyncio.sleep(SETTLE_S)
    after_send: dict[str, list[float]] = {step: [] for step in STEPS}
    for sent, response_id, at_client in timed:
        _add(after_send, sent, {**observer.seen.get(response_id, {}), **at_client})
    return after_send


def _add(after_send: dict[str, list[float]], start: float, times: dict[str, float]) -> None:
    for step, values in after_send.items():
        if step in times:
            values.append((times[step] - start) * 1000)


def report(after_send: dict[str, list[float]], since: str) -> str:
    lines = [f"{'step':15} {'p10':>6} {'p50':>6} {'p90':>6} {'mean':>6}  (ms after {since} was sent)  n"]
    for step, values in after_send.items():
        if values:
            lines.append(f"{step:15} {pct(values, .1):6.1f} {pct(values, .5):6.1f} {pct(values, .9):6.1f}"
                         f" {sum(values) / len(values):6.1f}  {len(values)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=None, help="default 16 in bursts, 32 in a closed loop")
    parser.add_argument("--rounds", type=int, default=30, help="bursts timed")
    parser.add_argument("--closed-loop", action="store_true",
                        help="clients that each send the next request when the last one ended")
    parser.add_argument("--seconds", type=float, default=10.0, help="of the closed loop timed")
    parser.add_argument("--nice", default="", help="process=niceness,... (parser, worker, api-0)")
    args = parser.parse_args()
    nice = {name: int(value) for name, value in (spec.split("=") for spec in args.nice.split(",") if spec)}
    if args.closed_loop:
        after_send = asyncio.run(measure(args.streams or 32, nice, closed_loop_s=args.seconds))
        since = "the request"
    else:
        after_send = asyncio.run(measure(args.streams or 16, nice, rounds=args.rounds))
        since = "the burst"
    print(report(after_send, since))


if __name__ == "__main__":
    main()
