"""Responses stream events: their names, their stored and live forms, and every
lifecycle and failure event, built here and nowhere else (the API, the parser and the
edge all end streams with these).

The payload of an event is the exact JSON text sent to clients (an ``openai`` SDK
``ResponseStreamEvent``, sequence number included); it is stored verbatim so a replay
is byte-identical to the live stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

import orjson
from pydantic import BaseModel, Field

# A cancelled response ends in ``response.completed`` carrying status "cancelled", as the
# SDK has no event of its own for it (TensorRT-LLM does the same).
TerminalEventType = Literal["response.completed", "response.incomplete", "response.failed"]
# Events that carry the whole Response (``response``); the last one is terminal.
LifecycleEventType = Literal["response.created", "response.in_progress", TerminalEventType]
# Every event type Steno sends (each is a ``type`` of the SDK's ResponseStreamEvent).
EventType = Literal[
    LifecycleEventType,
    "error",
    "response.output_item.added",
    "response.output_item.done",
    "response.content_part.added",
    "response.content_part.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.reasoning_text.delta",
    "response.reasoning_text.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.custom_tool_call_input.delta",
    "response.custom_tool_call_input.done",
    "response.code_interpreter_call.in_progress",
    "response.code_interpreter_call.interpreting",
    "response.code_interpreter_call.completed",
    "response.code_interpreter_call_code.delta",
    "response.code_interpreter_call_code.done",
    "response.mcp_call.in_progress",
    "response.mcp_call.completed",
    "response.mcp_call.failed",
    "response.mcp_call_arguments.delta",
    "response.mcp_call_arguments.done",
    "response.web_search_call.in_progress",
    "response.web_search_call.searching",
    "response.web_search_call.completed",
]
EVENT_TYPES: frozenset[str] = frozenset(get_args(EventType))
TERMINAL_EVENT_TYPES: frozenset[str] = frozenset(get_args(TerminalEventType))
LIFECYCLE_EVENT_TYPES: frozenset[str] = frozenset(get_args(LifecycleEventType))


# A dataclass, not a model: one is made for every event the parser builds, every event
# a tail hears announced and every row a replay reads, and a model's validation costs
# several times the dataclass's construction (docs/performance.md). The bus's model
# that carries events (``AnnouncedEvents``) still validates them where it is used.
@dataclass(slots=True)
class LoggedEvent:
    """One row of a response's event log."""

    seq: int
    type: str
    payload: str
    # Its link in the response's hash chain (``schemas/chain.py``), set by the writer that
    # stores it; None for events stored before there was a chain. Never sent on the bus:
    # live tails need the payload alone.
    hash: Annotated[bytes | None, Field(exclude=True)] = None

    @property
    def is_terminal(self) -> bool:
        return self.type in TERMINAL_EVENT_TYPES


def logged_event_json(event: LoggedEvent) -> bytes:
    """The event as a ``CommittedEvents`` carries it."""
    return orjson.dumps(_carried(event))


def _carried(event: LoggedEvent) -> dict[str, Any]:
    return {"seq": event.seq, "type": event.type, "payload": event.payload}


# A dataclass for the reason ``LoggedEvent`` is one: a tail reads one for every response
# in every announcement (``committed_in``).
@dataclass(slots=True, kw_only=True)
class CommittedEvents:
    """One response's events in an ``AnnouncedEvents``. Sequence numbers are contiguous.
    Events too large for a message are left out and announced by ``through_seq`` alone:
    everything up to it is committed, and a tail reads what it lacks from Postgres."""

    v: Literal[1] = 1
    response_id: str
    events: list[LoggedEvent]
    through_seq: int | None = None


def committed_events_json(response_id: str, events: list[LoggedEvent], through_seq: int | None = None) -> bytes:
    """``CommittedEvents(...).model_dump_json()``, the same bytes, written without
    building the model: the parser announces every event it commits, and building the
    model cost more than writing it (docs/performance.md, "Batches and announcements
    written without their models")."""
    return orjson.dumps({"v": 1, "response_id": response_id, "events": [_carried(event) for event in events],
                         "through_seq": through_seq})


class AnnouncedEvents(BaseModel):
    """Published on core NATS (``<ns>.events.<origin>``) right after a commit to Postgres,
    for live tails: the events just committed of every response the API process
    ``origin`` made or follows (``services/common/followers.py``)."""

    v: Literal[1] = 1
    committed: list[CommittedEvents]


def committed_in(announcement: bytes) -> list[CommittedEvents]:
    """``AnnouncedEvents.model_validate_json(announcement).committed``, read without the
    model's validation, which cost as much as the reading (docs/performance.md, "Logged
    events as dataclasses"): an API process reads every announcement made for it. One
    that is not what a parser writes raises here and is dropped, and the tails it was for
    read those events from Postgres at their next poll, as after a lost message."""
    message = orjson.loads(announcement)
    if message["v"] != 1:
        raise ValueError(f"an announcement of version {message['v']}, not 1")
    return [CommittedEvents(response_id=entry["response_id"],
                            events=[LoggedEvent(event["seq"], event["type"], event["payload"])
                                    for event in entry["events"]],
                            through_seq=entry.get("through_seq"))
            for entry in message["committed"]]


def logged_event(seq: int, type_: EventType, body: dict[str, Any]) -> LoggedEvent:
    """The event as stored and sent: ``type`` and ``sequence_number`` first, then ``body``."""
    payload = orjson.dumps({"type": type_, "sequence_number": seq, **body}).decode()
    return LoggedEvent(seq=seq, type=type_, payload=payload)


def lifecycle_event(seq: int, type_: LifecycleEventType, snapshot: dict[str, Any]) -> LoggedEvent:
    """``response.created`` (seq 0), ``response.in_progress`` or a terminal event."""
    return logged_event(seq, type_, {"response": snapshot})


def created_event(snapshot: dict[str, Any]) -> LoggedEvent:
    return lifecycle_event(0, "response.created", snapshot)


def failure_events(
    first_seq: int, snapshot: dict[str, Any], message: str, *, code: str = "server_error",
    event_code: str | None = None, **fields: Any,
) -> tuple[list[LoggedEvent], dict[str, Any]]:
    """How a stream ends that cannot finish: ``error`` then ``response.failed`` with the
    response failed (``code``, one of the SDK's ResponseError codes, on the response,
    with ``fields``; ``event_code``, if given, on the error event). Returns the events
    and the failed snapshot."""
    failed = {**snapshot, "status": "failed", "error": {"code": code, "message": message}, **fields}
    error = logged_event(first_seq, "error", {"code": event_code or code, "message": message, "param": None})
    return [error, lifecycle_event(first_seq + 1, "response.failed", failed)], failed
