"""Re-parsing a stored response from its record (pure): what ``steno audit`` proves a
log against. Events are a pure function of the request context and the token batches,
so the re-parse of an intact log is byte-identical to it, hashes included."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from steno.schemas.bus import TokenStreamMessage
from steno.schemas.events import LoggedEvent
from steno.schemas.responses import ParseContext
from steno.services.common.reasoning_seal import ReasoningSeal
from steno.services.parser.event_log import ResponseRecord
from steno.services.parser.response_state import ResponseState


@dataclass(frozen=True)
class Reparse:
    # The parser's events (seq 1 on), chained from the record's chain head.
    events: list[LoggedEvent]
    final_snapshot: dict[str, Any] | None
    # Where and why the re-parse could not go on (a stored batch it cannot apply).
    stopped_at: TokenStreamMessage | None = None
    error: str | None = None


def reparse(record: ResponseRecord, seal: ReasoningSeal | None = None) -> Reparse:
    """``seal``: the keys that seal reasoning, for a response whose reasoning is sealed.
    A chat-template model's files must be in the local model files directory."""
    events: list[LoggedEvent] = []
    try:
        state = ResponseState(record.response_id, record.base_snapshot,
                              ParseContext.model_validate(record.parse_context), seal=seal,
                              chain_head=record.chain_head)
    except Exception as exc:  # an unknown dialect, files that do not load
        return Reparse(events, None, None, f"{type(exc).__name__}: {exc}")
    for message in record.consumed:
        try:
            applied = state.apply(message)
        except Exception as exc:  # a stored batch out of order, or one the dialect cannot read
            return Reparse(events, None, message, f"{type(exc).__name__}: {exc}")
        if applied is not None:
            events += applied.events
    return Reparse(events, state.final_snapshot)
