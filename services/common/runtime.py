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

    with asyncio.Runner(loop_factory=event_loop_factory()) as runner_:
        runner_.run(runner())


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (the API's uvicorn uses it too): the parser and the
    worker spend about a tenth less CPU per request with it (``steno bench``)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
