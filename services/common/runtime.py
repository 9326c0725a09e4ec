"""Running a service's main coroutine: logging, and a clean exit on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Awaitable, Callable


def configure_logging(service: str) -> None:
    logging.basicConfig(
        level=os.environ.get("STENO_LOG_LEVEL", "INFO").upper(),
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
    )


def run_until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Runs ``main(stop)``; ``stop`` is set on SIGINT or SIGTERM and main should return."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())
