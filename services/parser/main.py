"""``steno parser``: consume token batches, append events to the log."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from functools import partial

from steno.services import dialects
from steno.services.common import bus
from steno.services.common.config import ParserSettings
from steno.services.common.health import (
    Readiness,
    consumers_bound,
    migrations_current,
    nats_connected,
    postgres_reachable,
)
from steno.services.common.logs import configure_logging
from steno.services.common.probe_server import serve_probes
from steno.services.common.runtime import instance_id, run_until_signalled
from steno.services.common.tracing import configure_tracing
from steno.services.parser.event_log import create_parser_pools
from steno.services.parser.service import ParserService

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve /metrics, /healthz and /readyz on this port (default: STENO_METRICS_PORT; "
                        "neither: not served)")


def run(args: argparse.Namespace) -> None:
    settings = ParserSettings.from_env()
    configure_logging("parser", settings)
    configure_tracing("parser", settings)

    async def main(stop: asyncio.Event) -> None:
        dialects.load_all()
        nc = await bus.connect(settings, "steno-parser")
        pools = await create_parser_pools(settings.database_url)
        parser_id = instance_id()
        names = await bus.deployment_names(nc.jetstream(), bus.Names.from_settings(settings))
        service = ParserService(nc, pools, names, parser_id)
        task = asyncio.create_task(service.run())
        probes = await serve_probes(args.metrics_port if args.metrics_port is not None else settings.metrics_port,
                                    Readiness({
                                        "nats": partial(nats_connected, nc),
                                        "postgres": partial(postgres_reachable, pools.planned),
                                        "migrations": partial(migrations_current, pools.planned),
                                        "consumers": partial(consumers_bound, nc.jetstream(), names.tokens_stream,
                                                             [names.parser_consumer(p)
                                                              for p in range(names.token_partitions)]),
                                    }))
        await asyncio.wait([task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        failed = task.done() and not task.cancelled() and task.exception() is not None
        if failed:
            log.error("parser stopped: %s", task.exception(), exc_info=task.exception())
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await service.stop()
        if probes is not None:
            await probes.stop()
        await nc.flush()
        await nc.close()
        await pools.close()
        if failed:
            # A supervisor restarts a process that failed, not one that finished.
            sys.exit(1)

    run_until_signalled(main)
