"""Server-sent events: ``event: <type>``, ``id: <sequence_number>``, ``data: <json>``.

While the log is silent the body carries SSE comment lines, which keep proxies and
clients from timing out and which SSE clients (the SDK included) ignore."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from steno.schemas.events import LoggedEvent
from steno.services.common.metrics import EDGE_STREAMS, StreamTiming

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}
KEEPALIVE_S = 15.0
KEEPALIVE_COMMENT = b": keepalive\n\n"

# Builds the events that end a stream the edge could not finish: (last seq sent) -> events.
FailureEvents = Callable[[int], list[LoggedEvent]]


# Characters some clients take for line ends (Python's str.splitlines does) though SSE
# does not: escaped in the data, which stays the same JSON.
_LINE_ENDS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def frame(event: LoggedEvent) -> bytes:
    data = event.payload if event.payload.isascii() else event.payload.translate(_LINE_ENDS)
    return f"event: {event.type}\nid: {event.seq}\ndata: {data}\n\n".encode()


async def sse_body(
    runs: AsyncGenerator[list[LoggedEvent], None], on_failure: FailureEvents, timing: StreamTiming | None = None
) -> AsyncGenerator[tuple[bytes, bool], None]:
    """Frames runs of events, one chunk per run, each with whether it ends the stream;
    an empty run (the log was silent) becomes a comment. If reading the runs fails, the
    stream ends visibly with ``on_failure``'s events instead of being cut. ``timing``
    hears of each run as it is framed."""
    last_seq = -1
    try:
        async for run in runs:
            if not run:
                yield KEEPALIVE_COMMENT, False
                continue
            last_seq = run[-1].seq
            if timing is not None:
                timing.sent(run)
            yield b"".join(frame(event) for event in run), run[-1].is_terminal
    except Exception:
        log.exception("stream ended by a failure after seq %d", last_seq)
        yield b"".join(frame(failure) for failure in on_failure(last_seq)), True
    finally:
        # Also when the stream is left early (its last chunk sent, the client gone).
        await runs.aclose()


class EventStreamResponse(Response):
    """Sends ``sse_body``'s chunks as they come; the chunk that ends the stream also ends
    the HTTP body (one write less than an empty closing chunk). A client that goes away
    stops the stream at once, whatever it is waiting for."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncGenerator[tuple[bytes, bool], None]) -> None:
        self._chunks = chunks
        self.status_code = 200
        self.background = None
        self.init_headers(SSE_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.current_task()
        assert streaming is not None  # a response is sent from within a task
        gone = False

        async def cancel_when_gone() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            streaming.cancel()

        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        watcher = asyncio.create_task(cancel_when_gone())
        EDGE_STREAMS.inc()
        try:
            async for chunk, last in self._chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                if last:
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone:
                raise
            streaming.uncancel()
        finally:
            EDGE_STREAMS.dec()
            watcher.cancel()
            await self._chunks.aclose()
