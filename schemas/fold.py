"""Rebuilds a Response snapshot from its stream events (pure).

Lifecycle events (``response.created`` / ``in_progress`` / terminal) give the response
fields and status; the output is rebuilt from the item events alone, so a fold that
agrees with the terminal event's snapshot proves the item events told the whole story."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from steno.schemas.events import LIFECYCLE_EVENT_TYPES, EventType

_TEXT_DELTAS: frozenset[EventType] = frozenset({"response.output_text.delta", "response.reasoning_text.delta"})
_TEXT_DONES: frozenset[EventType] = frozenset({"response.output_text.done", "response.reasoning_text.done"})
# Deltas and dones of the single text field of tool call items.
_FIELD_DELTAS: dict[EventType, str] = {
    "response.function_call_arguments.delta": "arguments",
    "response.mcp_call_arguments.delta": "arguments",
    "response.code_interpreter_call_code.delta": "code",
    "response.custom_tool_call_input.delta": "input",
}
_FIELD_DONES: dict[EventType, str] = {
    "response.function_call_arguments.done": "arguments",
    "response.mcp_call_arguments.done": "arguments",
    "response.code_interpreter_call_code.done": "code",
    "response.custom_tool_call_input.done": "input",
}


def fold(events: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    snapshot: dict[str, Any] | None = None
    output: list[dict[str, Any]] = []
    for event in events:
        kind = event["type"]
        if kind in LIFECYCLE_EVENT_TYPES:
            snapshot = {key: value for key, value in event["response"].items() if key != "output"}
        elif kind in ("response.output_item.added", "response.output_item.done"):
            item = copy.deepcopy(event["item"])
            index = event["output_index"]
            if index == len(output):
                output.append(item)
            else:
                output[index] = item
        elif kind == "response.content_part.added":
            output[event["output_index"]].setdefault("content", []).append(copy.deepcopy(event["part"]))
        elif kind == "response.content_part.done":
            output[event["output_index"]]["content"][event["content_index"]] = copy.deepcopy(event["part"])
        elif kind in _TEXT_DELTAS:
            part = output[event["output_index"]]["content"][event["content_index"]]
            part["text"] += event["delta"]
            if event.get("logprobs"):
                part.setdefault("logprobs", []).extend(event["logprobs"])
        elif kind in _TEXT_DONES:
            output[event["output_index"]]["content"][event["content_index"]]["text"] = event["text"]
        elif kind in _FIELD_DELTAS:
            item = output[event["output_index"]]
            field = _FIELD_DELTAS[kind]
            item[field] = (item.get(field) or "") + event["delta"]
        elif kind in _FIELD_DONES:
            field = _FIELD_DONES[kind]
            output[event["output_index"]][field] = event[field]
    if snapshot is None:
        return None
    return {**snapshot, "output": output}
