"""What noticing a dead process quickly costs (not a test).

Heartbeats: a worker (or parser) keeps each message it holds alive with in-progress acks. One
task per held message, each sleeping and acking, against one timer acking every held
message in turn (what the worker does); both send the same acks to NATS; the figure is
the worker process's CPU per second of holding.

Leases: two holders of the parsers' token partitions (PartitionLeases, as two parsers
run them) on a NATS server of its own, for each lease TTL / renewal period: KV writes per
second per holder (the buckets' stream sequence), and CPU per second of the holders'
process and of the NATS server.

    python -m steno.benchmarks.liveness
    python -m steno.benchmarks.liveness --held 64 --seconds 20

Heartbeats go to STENO_NATS_URL, else nats://127.0.0.1:4222 (to an inbox nobody reads)."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Callable, Coroutine
from contextlib import suppress
from pathlib import Path

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from steno.infra.embedded import answers, free_port, nats_server_binary
from steno.services.common import leases
from steno.services.common.in_progress import BEAT_S, InProgress

PARTITIONS = 8
HOLDERS = 2
# (lease TTL, renewal period) in seconds: before and after leases were shortened.
LEASE_TIMINGS = ((6.0, 2.0), (leases.LEASE_TTL_S, leases.RENEW_EVERY_S))


async def task_per_message(held: list[Msg], stop: asyncio.Event) -> None:
    async def beat(msg: Msg) -> None:
        while True:
            await asyncio.sleep(BEAT_S)
            await msg.in_progress()

    tasks = [asyncio.create_task(beat(msg)) for msg in held]
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def one_timer(held: list[Msg], stop: asyncio.Event) -> None:
    in_progress = InProgress()
    for msg in held:
        in_progress.hold(msg)
    while not stop.is_set():
        await asyncio.sleep(BEAT_S)
        await in_progress.beat()


Scheme = Callable[[list[Msg], asyncio.Event], Coroutine[None, None, None]]


async def heartbeat_cpu(nc: Client, scheme: Scheme, held_count: int, seconds: float) -> float:
    inbox = nc.new_inbox()
    held = [Msg(nc, subject="work", reply=f"{inbox}.{i}") for i in range(held_count)]
    stop = asyncio.Event()
    running = asyncio.create_task(scheme(held, stop))
    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    stop.set()
    await running
    await nc.flush()
    return cpu / wall


def cpu_seconds_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def lease_costs(url: str, server_pid: int, ttl_s: float, renew_s: float, seconds: float) -> str:
    leases.LEASE_TTL_S, leases.RENEW_EVERY_S = ttl_s, renew_s
    nc = await nats.connect(url)
    js = nc.jetstream()
    run = secrets.token_hex(3)
    buckets = (f"leases_{run}", f"holders_{run}")

    async def nothing(_: int) -> None:
        return None

    holders = [leases.PartitionLeases(nc, leases_bucket=buckets[0], holders_bucket=buckets[1],
                                      partitions=PARTITIONS, instance_id=f"holder-{i}",
                                      presence_prefix=f"presence_{run}") for i in range(HOLDERS)]
    rounds = [asyncio.create_task(holder.run(nothing, nothing)) for holder in holders]
    try:
        await asyncio.sleep(3 * renew_s + 1)  # shares settled

        async def writes() -> int:
            return sum([(await js.stream_info(f"KV_{bucket}")).state.last_seq for bucket in buckets])

        written, cpu, server_cpu, wall = (await writes(), time.process_time(), cpu_seconds_of(server_pid),
                                          time.monotonic())
        await asyncio.sleep(seconds)
        wall = time.monotonic() - wall
        written, cpu = await writes() - written, time.process_time() - cpu
        server_cpu = cpu_seconds_of(server_pid) - server_cpu
    finally:
        for task in rounds:
            task.cancel()
        await asyncio.gather(*rounds, return_exceptions=True)
        for bucket in buckets:
            with suppress(Exception):
                await js.delete_key_value(bucket)
        await nc.close()
    return (f"TTL {ttl_s:>4}s, renewed every {renew_s:>4}s: {written / wall / HOLDERS:6.1f} KV writes/s per holder, "
            f"holders {cpu / wall * 1000 / HOLDERS:5.2f} ms/s CPU each, NATS {server_cpu / wall * 1000:5.2f} ms/s")


async def main(args: argparse.Namespace) -> None:
    nc = await nats.connect(os.environ.get("STENO_NATS_URL", "nats://127.0.0.1:4222").split(","))
    try:
        print(f"heartbeats: in-progress acks every {BEAT_S}s, worker CPU per second of holding")
        for held_count in args.held:
            for name, scheme in (("task per message", task_per_message), ("one timer", one_timer)):
                share = await heartbeat_cpu(nc, scheme, held_count, args.seconds)
                print(f"{held_count:>5} held  {name:<17} {share * 1000:7.2f} ms/s")
    finally:
        await nc.close()
    print(f"leases: {HOLDERS} holders of {PARTITIONS} partitions, on a NATS server of their own")
    with tempfile.TemporaryDirectory(prefix="steno-liveness-") as store:
        port = free_port()
        server = subprocess.Popen([nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", store],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while not answers("127.0.0.1", port):
                await asyncio.sleep(0.05)
            for ttl_s, renew_s in LEASE_TIMINGS:
                print(await lease_costs(f"nats://127.0.0.1:{port}", server.pid, ttl_s, renew_s, args.seconds))
        finally:
            server.terminate()
            server.wait(15)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--held", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--seconds", type=float, default=10.0)
    asyncio.run(main(parser.parse_args()))
