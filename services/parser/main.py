"""``steno parser``: consume token batches, append events to the log."""

from __future__ import annotations

import argparse
import asyncio
import logging

from steno.services import dialects
from steno.services.common import bus, db
from steno.services.common.config import Settings
from steno.services.common.runtime import configure_logging, instance_id, run_until_signalled
from steno.services.parser.service import ParserService

log = logging.getLogger(__name__)


def run(_: argparse.Namespace) -> None:
    configure_logging("parser")
    settings = Settings.from_env()

    async def main(stop: asyncio.Event) -> None:
        dialects.load_all()
        nc = await bus.connect(settings, "steno-parser")
        # One connection per partition it may hold, so commits never queue for a connection.
        pool = await db.create_pool(settings.database_url, max_size=settings.token_partitions + 2)
        parser_id = instance_id()
        service = ParserService(nc, pool, bus.Names.from_settings(settings), parser_id)
        task = asyncio.create_task(service.run())
        log.info("parser %s ready", parser_id)
        await asyncio.wait([task, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await service.stop()
        await nc.flush()
        await nc.close()
        await pool.close()

    run_until_signalled(main)
