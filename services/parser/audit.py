"""Re-parses a response from its stored token batches and compares with its stored log.

Because events are a pure function of the stored request context and batches, the
re-parse must be byte-identical to the log; ``restore`` writes back events that are
missing (never overwriting one that exists)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg

from steno.schemas.events import LoggedEvent
from steno.schemas.responses import ParseContext
from steno.services.common.reasoning_keys import ReasoningKeys
from steno.services.parser.event_log import EventLog, ResponseWrite
from steno.services.parser.response_state import ResponseState


@dataclass(frozen=True)
class AuditResult:
    reparsed: list[LoggedEvent]
    stored: list[LoggedEvent]

    @property
    def identical(self) -> bool:
        return [(e.seq, e.type, e.payload) for e in self.reparsed] == [(e.seq, e.type, e.payload) for e in self.stored]

    def first_difference(self) -> int | None:
        for mine, theirs in zip(self.reparsed, self.stored):
            if (mine.seq, mine.payload) != (theirs.seq, theirs.payload):
                return mine.seq
        if len(self.reparsed) != len(self.stored):
            return min(len(self.reparsed), len(self.stored)) + 1
        return None


async def audit(pool: asyncpg.Pool, response_id: str, restore: bool = False,
                fetch_model_files: Callable[[str], Awaitable[None]] | None = None) -> AuditResult:
    """``fetch_model_files``: puts the model files of a digest into the local directory
    (for a chat-template model's response, whose files are on the bus)."""
    log = EventLog(pool)
    record = await log.load(response_id)
    if record is None:
        raise LookupError(f"no response {response_id}")
    context = ParseContext.model_validate(record.parse_context)
    if context.dialect_files is not None and fetch_model_files is not None:
        await fetch_model_files(context.dialect_files)
    sealing = context.reasoning_sealing
    seal = await ReasoningKeys(pool).holding(sealing.key_id) if sealing is not None else None
    state = ResponseState(response_id, record.base_snapshot, context, seal=seal)
    reparsed: list[LoggedEvent] = []
    for message in record.consumed:
        applied = state.apply(message)
        if applied is not None:
            reparsed += applied.events
    if restore and reparsed:
        await log.commit([ResponseWrite(response_id, events=reparsed)])
    rows = await pool.fetch(
        "SELECT seq, type, payload FROM response_events WHERE response_id = $1 AND seq >= 1 ORDER BY seq", response_id
    )
    stored = [LoggedEvent(seq=r[0], type=r[1], payload=r[2]) for r in rows]
    return AuditResult(reparsed, stored)
