"""The SSE edge: replays a response's stored log and tails it live."""

from services.edge.event_reader import EventReader
from services.edge.sse import SSE_HEADERS, frame, sse_body
from services.edge.tail import ResponseTail

__all__ = ["EventReader", "ResponseTail", "SSE_HEADERS", "frame", "sse_body"]
