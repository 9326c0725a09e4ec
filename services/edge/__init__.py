"""The SSE edge: replays a response's stored log and tails it live."""

from steno.services.edge.event_reader import EventReader
from steno.services.edge.sse import KEEPALIVE_S, SSE_HEADERS, EventStreamResponse, frame, sse_body
from steno.services.edge.tail import LiveEvents, ResponseTail

__all__ = [
           "KEEPALIVE_S",
           "SSE_HEADERS",
           "EventReader",
           "EventStreamResponse",
           "LiveEvents",
           "ResponseTail",
           "frame",
           "sse_body",
]
