"""Server-sent events: ``event: <type>``, ``id: <sequence_number>``, ``data: <json>``.

While the log is silent the body carries SSE comment lines, which keep proxies and
clients from timing out and which SSE clients (the SDK included) ignore."""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Callable

from schemas.events import LoggedEvent

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}
KEEPALIVE_S = 15.0
KEEPALIVE_COMMENT = b": keepalive\n\n"

# Builds the events that end a stream the edge could not finish: (last seq sent) -> events.
FailureEvents = Callable[[int], list[LoggedEvent]]


def frame(event: LoggedEvent) -> bytes:
    return f"event: {event.type}\nid: {event.seq}\ndata: {event.payload}\n\n".encode()


async def sse_body(
    runs: AsyncIterator[list[LoggedEvent]], on_failure: FailureEvents, keepalive_s: float = KEEPALIVE_S
) -> AsyncIterator[bytes]:
    """Frames runs of events (one chunk per run); comments while they are silent; if
    reading them fails, ends the stream visibly with ``on_failure``'s events instead of
    cutting it."""
    last_seq = -1
    iterator = runs.__aiter__()
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=keepalive_s)
            if not done:
                yield KEEPALIVE_COMMENT
                continue
            try:
                run = pending.result()
            except StopAsyncIteration:
                return
            except Exception:
                log.exception("stream ended by a failure after seq %d", last_seq)
                yield b"".join(frame(failure) for failure in on_failure(last_seq))
                return
            finally:
                pending = None
            last_seq = run[-1].seq
            yield b"".join(frame(event) for event in run)
    finally:
        if pending is not None:
            # Cancelling the pending read ends the generator (its cleanup runs).
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await iterator.aclose()
