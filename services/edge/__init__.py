"""The SSE edge: replays a response's stored log and tails it live."""

from services.edge.event_reader import EventReader
from services.edge.sse import SSE_HEADERS, frame, sse_body
from services.edge.tail import LiveEvents, ResponseTail

__all__ = ["EventReader", "LiveEvents", "ResponseTail", "SSE_HEADERS", "frame", "sse_body"]
