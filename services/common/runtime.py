"""Running a service's main coroutine, with a clean exit on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import os
import secrets
import signal
import socket
from collections.abc import Awaitable, Callable


def instance_id() -> str:
    """This process among its service's others, as it holds leases: host, pid and a
    random part, so a restarted process with a reused pid is a new holder."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


# Net new container objects between collections of the young generation (Python's
# default is 700). A busy service holds thousands of short-lived objects in flight (a
# step's batches, a commit's rows, a burst's requests), so at the default the count
# crossed the threshold over and over, each collection walked and promoted what was
# merely in flight, and those promotions brought on full collections
# (docs/performance.md has what the collections cost before and after).
YOUNG_COLLECTION_THRESHOLD = 10_000


def tune_garbage_collector() -> None:
    """Moves everything alive after start-up (modules, pydantic and SDK types, the app)
    out of the collector's sight, and collects the young generation less often. Without
    the first, each full collection walks those hundreds of thousands of objects, a pause
    in the API and the parser that the slowest streams of a burst waited for. Call it
    once the service is set up."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)


def run_until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Runs ``main(stop)``; ``stop`` is set on SIGINT or SIGTERM and main should return."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        tune_garbage_collector()
        await main(stop)

    with asyncio.Runner(loop_factory=event_loop_factory()) as runner_:
        runner_.run(runner())


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (the API's uvicorn uses it too): the parser and the
    worker spend less CPU per request with it (docs/performance.md)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
