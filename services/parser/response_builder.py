"""Turns message fragments (from the response's dialect) into Responses stream events
(pure, no I/O).

Everything an event contains — item ids, call ids, sequence numbers, text — derives
from the response's stored context and the token batches in order, so re-running a
builder over the same batches yields byte-identical events. Deltas are coalesced per
token batch: one delta event per item per batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from steno.schemas.bus import GenerationEnded
from steno.schemas.events import (
    EventType,
    LoggedEvent,
    TerminalEventType,
    failure_events,
    lifecycle_event,
    logged_event,
)
from steno.schemas.responses import ParseContext
from steno.services.dialects import Fragment, MalformedOutput, MessageEnded, MessageStarted, TextDelta
from steno.services.parser.items import MessageItem, OutputItem, ReasoningSealer, classify

TokenDecoder = Callable[[int], str]


class ResponseBuilder:
    def __init__(
        self,
        response_id: str,
        base_snapshot: dict[str, Any],
        context: ParseContext,
        decode_token: TokenDecoder | None = None,
        first_seq: int = 1,
        seal_reasoning: ReasoningSealer | None = None,
    ) -> None:
        self.response_id = response_id
        self._seal_reasoning = seal_reasoning
        self._base = base_snapshot
        self._context = context
        self._decode_token = decode_token or str
        self._next_seq = first_seq
        self._items: list[OutputItem] = []
        self._open: OutputItem | None = None
        self._malformed: str | None = None
        self._events: list[LoggedEvent] = []
        self.final_snapshot: dict[str, Any] | None = None

    def _emit(self, type_: EventType, body: dict[str, Any]) -> None:
        self._append(logged_event(self._next_seq, type_, body))

    def _append(self, event: LoggedEvent) -> None:
        self._events.append(event)
        self._next_seq = event.seq + 1

    def _take_events(self) -> list[LoggedEvent]:
        events, self._events = self._events, []
        return events

    def _snapshot(self, status: str, **extra: Any) -> dict[str, Any]:
        return {**self._base, "status": status, "output": [item.item for item in self._items], **extra}

    def start(self) -> list[LoggedEvent]:
        return self.keepalive()

    def keepalive(self) -> list[LoggedEvent]:
        self._append(lifecycle_event(self._next_seq, "response.in_progress", self._snapshot("in_progress")))
        return self._take_events()

    def consume(
        self,
        fragments: list[Fragment],
        token_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        top_logprobs: list[list[tuple[int, float]]] | None = None,
    ) -> list[LoggedEvent]:
        pending: list[str] = []
        pending_logprobs: list[dict[str, Any]] = []

        def flush() -> None:
            if pending and self._open is not None:
                self._open.delta(self._emit, "".join(pending), list(pending_logprobs))
            pending.clear()
            pending_logprobs.clear()

        for fragment in fragments:
            if isinstance(fragment, TextDelta):
                pending.append(fragment.text)
                if logprobs is not None and isinstance(self._open, MessageItem) and self._open.with_logprobs:
                    pending_logprobs.extend(
                        self._logprob_entry(token_ids, logprobs, top_logprobs, index)
                        for index in range(fragment.token_index, fragment.token_index + fragment.token_count))
            elif isinstance(fragment, MessageStarted):
                flush()
                self._open_item(fragment)
            elif isinstance(fragment, MessageEnded):
                flush()
                self._close_item("completed")
            elif isinstance(fragment, MalformedOutput):
                flush()
                self._malformed = fragment.detail
        flush()
        return self._take_events()

    def finish(self, ended: GenerationEnded, reasoning_tokens: int) -> list[LoggedEvent]:
        """Closes what is open (``incomplete`` unless the engine stopped normally) and
        appends the terminal event."""
        if self._open is not None:
            self._close_item("completed" if ended.finish_reason == "stop" else "incomplete")
        usage = {
            "input_tokens": ended.prompt_tokens,
            "input_tokens_details": {"cached_tokens": ended.cached_tokens or 0, "cache_write_tokens": 0},
            "output_tokens": ended.output_tokens,
            "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, ended.output_tokens)},
            "total_tokens": ended.prompt_tokens + ended.output_tokens,
        }
        ending: dict[str, Any] = {"usage": usage}
        if "completed_at" in self._base:  # responses created before it was reported go without
            ending["completed_at"] = ended.completed_at
        if ended.finish_reason == "error" or (self._malformed and ended.finish_reason == "stop"):
            message = ended.error_message or f"The model produced malformed output: {self._malformed}"
            events, snapshot = failure_events(self._next_seq, self._snapshot("failed"), message,
                                              code=ended.error_code or "server_error", **ending)
            for event in events:
                self._append(event)
        else:
            terminal: TerminalEventType
            if ended.finish_reason == "length":
                snapshot = self._snapshot("incomplete", incomplete_details={"reason": "max_output_tokens"},
                                          **ending)
                terminal = "response.incomplete"
            else:
                snapshot = self._snapshot("cancelled" if ended.finish_reason == "cancelled" else "completed",
                                          **ending)
                terminal = "response.completed"
            self._append(lifecycle_event(self._next_seq, terminal, snapshot))
        self.final_snapshot = snapshot
        return self._take_events()

    def _open_item(self, started: MessageStarted) -> None:
        if self._open is not None:
            self._close_item("completed")
        item = classify(self.response_id, len(self._items), started.channel, started.recipient, self._context,
                        self._seal_reasoning)
        self._items.append(item)
        self._open = item
        item.open(self._emit)

    def _close_item(self, status: str) -> None:
        assert self._open is not None
        self._open.close(self._emit, status)
        self._open = None

    def _logprob_entry(
        self,
        token_ids: list[int] | None,
        logprobs: list[float],
        top_logprobs: list[list[tuple[int, float]]] | None,
        index: int,
    ) -> dict[str, Any]:
        decode = self._decode_token
        token = decode(token_ids[index]) if token_ids is not None else ""
        alternatives = top_logprobs[index] if top_logprobs else []
        return {
            "token": token,
            "logprob": logprobs[index],
            "bytes": list(token.encode()),
            "top_logprobs": [
                {"token": decode(tid), "logprob": lp, "bytes": list(decode(tid).encode())} for tid, lp in alternatives
            ],
        }
