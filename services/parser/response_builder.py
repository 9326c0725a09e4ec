"""Turns Harmony message fragments into Responses stream events (pure, no I/O).

Everything an event contains — item ids, call ids, sequence numbers, text — derives
from the response's stored context and the token batches in order, so re-running a
builder over the same batches yields byte-identical events. Deltas are coalesced per
token batch: one delta event per item per batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import orjson

from schemas.bus import GenerationEnded
from schemas.events import LoggedEvent
from schemas.ids import derived_id
from schemas.responses import ParseContext
from services.parser.harmony import Fragment, MalformedOutput, MessageEnded, MessageStarted, TextDelta

TokenDecoder = Callable[[int], str]


@dataclass
class _OpenItem:
    kind: str  # "reasoning" | "message" | "function_call"
    output_index: int
    item: dict[str, Any]
    text: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)


_DELTA_TYPES = {
    "reasoning": "response.reasoning_text.delta",
    "message": "response.output_text.delta",
    "function_call": "response.function_call_arguments.delta",
}


class ResponseBuilder:
    def __init__(
        self,
        response_id: str,
        base_snapshot: dict[str, Any],
        context: ParseContext,
        decode_token: TokenDecoder | None = None,
        first_seq: int = 1,
    ) -> None:
        self.response_id = response_id
        self._base = base_snapshot
        self._context = context
        self._decode_token = decode_token
        self._next_seq = first_seq
        self._output: list[dict[str, Any]] = []
        self._open: _OpenItem | None = None
        self._malformed: str | None = None
        self.final_snapshot: dict[str, Any] | None = None

    # -- event plumbing -------------------------------------------------------------
    def _event(self, events: list[LoggedEvent], type_: str, body: dict[str, Any]) -> None:
        seq = self._next_seq
        self._next_seq += 1
        payload = {"type": type_, "sequence_number": seq, **body}
        events.append(LoggedEvent.model_construct(seq=seq, type=type_, payload=orjson.dumps(payload).decode()))

    def _snapshot(self, status: str, **extra: Any) -> dict[str, Any]:
        return {**self._base, "status": status, "output": list(self._output), **extra}

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> list[LoggedEvent]:
        events: list[LoggedEvent] = []
        self._event(events, "response.in_progress", {"response": self._snapshot("in_progress")})
        return events

    def consume(
        self,
        fragments: list[Fragment],
        token_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        top_logprobs: list[list[tuple[int, float]]] | None = None,
    ) -> list[LoggedEvent]:
        events: list[LoggedEvent] = []
        pending: list[str] = []
        pending_logprobs: list[dict[str, Any]] = []

        def flush() -> None:
            if pending and self._open is not None:
                self._emit_delta(events, "".join(pending), pending_logprobs)
            pending.clear()
            pending_logprobs.clear()

        for fragment in fragments:
            if isinstance(fragment, TextDelta):
                pending.append(fragment.text)
                if self._wants_logprobs() and token_ids is not None and logprobs is not None:
                    pending_logprobs.append(
                        self._logprob_entry(token_ids, logprobs, top_logprobs, fragment.token_index)
                    )
            elif isinstance(fragment, MessageStarted):
                flush()
                self._open_item(events, fragment)
            elif isinstance(fragment, MessageEnded):
                flush()
                self._close_item(events, "completed")
            elif isinstance(fragment, MalformedOutput):
                flush()
                self._malformed = fragment.detail
        flush()
        return events

    def finish(self, ended: GenerationEnded, reasoning_tokens: int) -> list[LoggedEvent]:
        """Closes what is open (``incomplete`` unless the engine stopped normally) and
        appends the terminal event."""
        events: list[LoggedEvent] = []
        item_status = "completed" if ended.finish_reason == "stop" else "incomplete"
        if self._open is not None:
            self._close_item(events, item_status)
        usage = {
            "input_tokens": ended.prompt_tokens,
            "input_tokens_details": {"cached_tokens": ended.cached_tokens or 0, "cache_write_tokens": 0},
            "output_tokens": ended.output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": ended.prompt_tokens + ended.output_tokens,
        }
        if ended.finish_reason == "error" or (self._malformed and ended.finish_reason == "stop"):
            code = ended.error_code or "server_error"
            message = ended.error_message or f"the model produced malformed output: {self._malformed}"
            self._event(events, "error", {"code": code, "message": message, "param": None})
            snapshot = self._snapshot("failed", error={"code": code, "message": message}, usage=usage)
            terminal = "response.failed"
        elif ended.finish_reason == "length":
            snapshot = self._snapshot(
                "incomplete", incomplete_details={"reason": "max_output_tokens"}, usage=usage
            )
            terminal = "response.incomplete"
        else:
            status = "cancelled" if ended.finish_reason == "cancelled" else "completed"
            snapshot = self._snapshot(status, usage=usage)
            terminal = "response.completed"
        self._event(events, terminal, {"response": snapshot})
        self.final_snapshot = snapshot
        return events

    # -- items ----------------------------------------------------------------------
    def _open_item(self, events: list[LoggedEvent], started: MessageStarted) -> None:
        if self._open is not None:
            self._close_item(events, "completed")
        index = len(self._output)
        recipient = started.recipient or ""
        if recipient.startswith("functions."):
            kind = "function_call"
            item = {
                "id": derived_id("fc", self.response_id, index),
                "type": "function_call",
                "status": "in_progress",
                "call_id": derived_id("call", self.response_id, index),
                "name": recipient.removeprefix("functions."),
                "arguments": "",
            }
        elif started.channel == "analysis":
            kind = "reasoning"
            item = {
                "id": derived_id("rs", self.response_id, index),
                "type": "reasoning",
                "status": "in_progress",
                "summary": [],
                "content": [],
            }
        else:
            kind = "message"
            item = {
                "id": derived_id("msg", self.response_id, index),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "phase": "commentary" if started.channel == "commentary" else "final_answer",
                "content": [],
            }
        self._open = _OpenItem(kind=kind, output_index=index, item=item)
        self._output.append(item)
        self._event(events, "response.output_item.added", {"output_index": index, "item": dict(item)})
        if kind != "function_call":
            self._event(events, "response.content_part.added", {**self._part_address(), "part": self._part("")})

    def _part_address(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open.item["id"], "output_index": self._open.output_index, "content_index": 0}

    def _part(self, text: str) -> dict[str, Any]:
        assert self._open is not None
        if self._open.kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
        if self._wants_logprobs():
            part["logprobs"] = list(self._open.logprobs) if text else []
        return part

    def _emit_delta(self, events: list[LoggedEvent], delta: str, logprobs: list[dict[str, Any]]) -> None:
        item = self._open
        assert item is not None
        item.text.append(delta)
        if item.kind == "function_call":
            body = {"item_id": item.item["id"], "output_index": item.output_index, "delta": delta}
        else:
            body = {**self._part_address(), "delta": delta}
            if item.kind == "message":
                body["logprobs"] = list(logprobs)
                item.logprobs.extend(logprobs)
        self._event(events, _DELTA_TYPES[item.kind], body)

    def _close_item(self, events: list[LoggedEvent], status: str) -> None:
        item = self._open
        assert item is not None
        text = "".join(item.text)
        address = self._part_address()
        if item.kind == "function_call":
            self._event(
                events,
                "response.function_call_arguments.done",
                {"item_id": item.item["id"], "output_index": item.output_index, "arguments": text},
            )
            item.item["arguments"] = text
        elif item.kind == "reasoning":
            self._event(events, "response.reasoning_text.done", {**address, "text": text})
            item.item["content"] = [self._part(text)]
        else:
            self._event(events, "response.output_text.done", {**address, "text": text, "logprobs": list(item.logprobs)})
            item.item["content"] = [self._part(text)]
        if item.kind != "function_call":
            self._event(events, "response.content_part.done", {**address, "part": self._part(text)})
        item.item["status"] = status
        self._output[item.output_index] = item.item
        self._event(events, "response.output_item.done", {"output_index": item.output_index, "item": dict(item.item)})
        self._open = None

    # -- logprobs -------------------------------------------------------------------
    def _wants_logprobs(self) -> bool:
        return self._context.include_logprobs and self._open is not None and self._open.kind == "message"

    def _logprob_entry(
        self,
        token_ids: list[int],
        logprobs: list[float],
        top_logprobs: list[list[tuple[int, float]]] | None,
        index: int,
    ) -> dict[str, Any]:
        decode = self._decode_token or str
        token = decode(token_ids[index])
        entry: dict[str, Any] = {"token": token, "logprob": logprobs[index], "bytes": list(token.encode())}
        alternatives = top_logprobs[index] if top_logprobs else []
        entry["top_logprobs"] = [
            {"token": decode(tid), "logprob": lp, "bytes": list(decode(tid).encode())} for tid, lp in alternatives
        ]
        return entry
