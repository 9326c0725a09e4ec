"""A stored stream as its clients received it: every event framed as the edge frames it
(``services/edge/sse.py``), each with the time it was stored.

``sse``: the edge's frames, byte for byte, each preceded by an SSE comment line
(``: stored <time>``), which SSE clients ignore, so the text is still the stream (less
the keepalive comments a slow stream also carried). ``jsonl``: one JSON object per event,
the payload embedded as the frame's data carries it, with its time and hash."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import orjson

from steno.schemas.events import LoggedEvent
from steno.services.audit.records import StoredEvent
from steno.services.edge import frame

FORMATS = ("sse", "jsonl")


def stored_time(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def replay(events: Iterable[StoredEvent], format: str = "sse") -> bytes:
    if format == "sse":
        return b"".join(f": stored {stored_time(event.stored_at)}\n".encode()
                        + frame(LoggedEvent(seq=event.seq, type=event.type, payload=event.payload))
                        for event in events)
    if format == "jsonl":
        return b"".join(_jsonl(event) for event in events)
    raise ValueError(f"unknown replay format {format!r} (one of {', '.join(FORMATS)})")


def _jsonl(event: StoredEvent) -> bytes:
    head = orjson.dumps({"seq": event.seq, "type": event.type, "stored_at": stored_time(event.stored_at),
                         "hash": event.hash.hex() if event.hash is not None else None})
    # The event as its frame's data line carries it: the payload with the characters
    # some readers take for line ends escaped (still the same JSON), so a line is an event.
    framed = frame(LoggedEvent(seq=event.seq, type=event.type, payload=event.payload))
    data = framed[framed.index(b"\ndata: ") + len(b"\ndata: "):-2]
    return head[:-1] + b',"event":' + data + b"}\n"
