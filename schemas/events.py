"""Stored and live forms of Responses stream events.

The payload of an event is the exact JSON text sent to clients (an ``openai`` SDK
``ResponseStreamEvent``, sequence number included); it is stored verbatim so a replay
is byte-identical to the live stream."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

# A cancelled response ends in ``response.completed`` carrying status "cancelled", as the
# SDK has no event of its own for it (TensorRT-LLM does the same).
TERMINAL_EVENT_TYPES = frozenset({"response.completed", "response.incomplete", "response.failed"})


class LoggedEvent(BaseModel):
    """One row of a response's event log."""

    seq: int
    type: str
    payload: str

    @property
    def is_terminal(self) -> bool:
        return self.type in TERMINAL_EVENT_TYPES


class CommittedEvents(BaseModel):
    """Published on core NATS (``<ns>.events.<response_id>``) right after the events
    are committed to Postgres, for live tails. Sequence numbers are contiguous."""

    v: Literal[1] = 1
    response_id: str
    events: list[LoggedEvent]
