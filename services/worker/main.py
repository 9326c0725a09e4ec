"""``steno worker``: serve one model with an engine."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from services.common import bus
from services.common.config import Settings
from services.common.harmony_vocab import harmony_encoding
from services.common.runtime import configure_logging, run_until_signalled
from services.worker.simulator import SimulatorEngine, SimulatorTiming
from services.worker.worker import GenerationWorker

log = logging.getLogger(__name__)

DEFAULT_MODEL = "steno-simulator"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model name clients ask for")
    parser.add_argument("--engine", choices=["simulator"], default="simulator")
    parser.add_argument("--concurrency", type=int, default=64, help="generations in flight at most")
    parser.add_argument("--batch-interval-ms", type=float, default=5.0, help="token batch coalescing window")
    parser.add_argument("--batch-max-tokens", type=int, default=64)
    parser.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to finish work on SIGTERM")
    parser.add_argument("--sim-first-token-delay-ms", type=float, default=0.0)
    parser.add_argument("--sim-tokens-per-s", type=float, default=200.0, help="0 = unlimited")


def run(args: argparse.Namespace) -> None:
    configure_logging("worker")
    settings = Settings.from_env()

    async def main(stop: asyncio.Event) -> None:
        encoding = harmony_encoding()
        engine = SimulatorEngine(
            encoding,
            SimulatorTiming(
                first_token_delay_s=args.sim_first_token_delay_ms / 1000, tokens_per_s=args.sim_tokens_per_s
            ),
        )
        nc = await bus.connect(settings.nats_url, f"steno-worker-{args.model}")
        worker = GenerationWorker(
            nc,
            bus.Names(settings.namespace, settings.token_partitions),
            args.model,
            engine,
            concurrency=args.concurrency,
            batch_interval_s=args.batch_interval_ms / 1000,
            batch_max_tokens=args.batch_max_tokens,
        )
        task = asyncio.create_task(worker.run())
        await asyncio.wait([task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        if task.done() and task.exception():
            log.error("worker stopped: %s", task.exception())
            sys.exit(1)
        await worker.stop(args.drain_timeout)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await engine.close()
        await nc.flush()
        await nc.close()

    run_until_signalled(main)
