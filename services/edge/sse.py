"""Server-sent event framing: ``event: <type>``, ``id: <sequence_number>``, ``data: <json>``."""

from __future__ import annotations

from schemas.events import LoggedEvent


def frame(event: LoggedEvent) -> bytes:
    return f"event: {event.type}\nid: {event.seq}\ndata: {event.payload}\n\n".encode()


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Connection": "keep-alive"}
