"""Where a burst's time goes: bursts of simultaneous streams against a bench stack, with
an observer on the bus noting when each response was queued for a worker, when its
first token batch was published and when its events were announced, beside the
client's own times for ``response.created`` and the first content.

    python -m steno.benchmarks.stage_timings [--streams 16] [--rounds 30] [--nice parser=-10,worker=-5]

Prints, per step, the p10 / p50 / p90 of milliseconds after the burst was sent."""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import orjson

from steno.benchmarks.harness import CONTENT_EVENTS, MODEL, Bench, pct
from steno.benchmarks.sse_client import SseClient
from steno.schemas.bus import token_partition_message, unpacked
from steno.services.common.bus import connect

STEPS = ("queued", "created", "batch", "announced", "content")


async def measure(streams: int, rounds: int, nice: dict[str, int]) -> dict[str, list[float]]:
    bench = Bench(Path(tempfile.mkdtemp(prefix="steno-stages-")))
    await bench.start()
    try:
        for name, value in nice.items():
            os.setpriority(os.PRIO_PROCESS, bench.pids()[name], value)
        namespace = bench.settings.namespace
        nc = await connect(bench.settings, "stage-observer")
        seen: dict[str, dict[str, float]] = {}

        def mark(response_id: str | None, step: str) -> None:
            if response_id:
                seen.setdefault(response_id, {}).setdefault(step, time.perf_counter())

        async def on_queued(msg) -> None:
            mark((msg.headers or {}).get("Nats-Msg-Id"), "queued")

        async def on_batch(msg) -> None:
            for message, _ in unpacked(token_partition_message.validate_json(msg.data), None):
                mark(message.response_id, "batch")

        async def on_announced(msg) -> None:
            for committed in orjson.loads(msg.data)["committed"]:
                mark(committed["response_id"], "announced")

        await nc.subscribe(f"{namespace}.gen.>", cb=on_queued)
        await nc.subscribe(f"{namespace}.tokens.>", cb=on_batch)
        await nc.subscribe(f"{namespace}.events.>", cb=on_announced)
        await nc.flush()
        after_send: dict[str, list[float]] = {step: [] for step in STEPS}
        async with SseClient(bench.steno_url, connections=streams) as client:

            async def one(i: int) -> tuple[float, str, float, float]:
                sent = time.perf_counter()
                frames = (await client.post_stream("/v1/responses", {"model": MODEL, "input": f"stages {i}",
                                                                     "stream": True})).frames
                response_id = orjson.loads(frames[0][1])["response"]["id"]
                content = next(at for at, data in frames if any(kind in data[:60] for kind in CONTENT_EVENTS))
                return sent, response_id, frames[0][0], content

            for _ in range(3):  # warm, as the harness does
                await asyncio.gather(*(one(i) for i in range(streams)))
            for _ in range(rounds):
                burst = await asyncio.gather(*(one(i) for i in range(streams)))
                start = min(sent for sent, *_ in burst)
                await asyncio.sleep(0.05)  # the observer's last messages
                for _, response_id, created, content in burst:
                    times = {**seen.get(response_id, {}), "created": created, "content": content}
                    for step in STEPS:
                        if step in times:
                            after_send[step].append((times[step] - start) * 1000)
        await nc.close()
        return after_send
    finally:
        await bench.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--nice", default="", help="process=niceness,... (parser, worker, api-0)")
    args = parser.parse_args()
    nice = {name: int(value) for name, value in (spec.split("=") for spec in args.nice.split(",") if spec)}
    after_send = asyncio.run(measure(args.streams, args.rounds, nice))
    print(f"{'step':10} {'p10':>6} {'p50':>6} {'p90':>6}  (ms after the burst was sent)  n")
    for step in STEPS:
        values = after_send[step]
        if values:
            print(f"{step:10} {pct(values, .1):6.1f} {pct(values, .5):6.1f} {pct(values, .9):6.1f}  {len(values)}")


if __name__ == "__main__":
    main()
