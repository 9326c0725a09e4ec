"""A whole conversation, turn by turn: every turn's instructions, input items, and
output (reasoning, tool calls, messages), as JSON (the items exactly as stored) or as
Markdown for reading. Pure: the turns come from ``records.py``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from steno.services.audit.records import Turn
from steno.services.audit.replay import stored_time

FORMATS = ("markdown", "json")


@dataclass(frozen=True)
class Transcript:
    # The response (its previous_response_id chain) or the conversation it is of.
    of: str
    kind: str  # "response_chain" | "conversation"
    turns: list[Turn]


@dataclass(frozen=True)
class ItemView:
    """An item as a reader sees it: who or what, and its text."""

    kind: str
    title: str
    text: str


def as_json(transcript: Transcript) -> dict[str, Any]:
    return {
        "object": "audit.transcript",
        "of": transcript.of,
        "kind": transcript.kind,
        "turns": [
            {
                "response_id": turn.response_id,
                "previous_response_id": turn.previous_response_id,
                "model": turn.model,
                "status": turn.status,
                "created_at": stored_time(turn.created_at) if turn.created_at is not None else None,
                "instructions": turn.instructions,
                "input": turn.input,
                "output": turn.output,
            }
            for turn in transcript.turns
        ],
    }


def render(transcript: Transcript, format: str = "markdown") -> str:
    if format == "json":
        return orjson.dumps(as_json(transcript), option=orjson.OPT_INDENT_2).decode() + "\n"
    if format == "markdown":
        return markdown(transcript)
    raise ValueError(f"unknown transcript format {format!r} (one of {', '.join(FORMATS)})")


def markdown(transcript: Transcript) -> str:
    what = "conversation" if transcript.kind == "conversation" else "previous_response_id chain ending at"
    count = len(transcript.turns)
    lines = [f"# Transcript of {what} {transcript.of}", "", f"{count} turn{'s' * (count != 1)}.", ""]
    for number, turn in enumerate(transcript.turns, 1):
        if turn.response_id is None:
            lines += [f"## Turn {number}: items added to the conversation", ""]
        else:
            lines += [f"## Turn {number}: {turn.response_id}", ""]
            facts = [f"model `{turn.model}`", str(turn.status)]
            if turn.created_at is not None:
                facts.append(f"created {stored_time(turn.created_at)}")
            if turn.previous_response_id:
                facts.append(f"after {turn.previous_response_id}")
            lines += [" · ".join(facts), ""]
        if turn.instructions:
            lines += ["**instructions**", "", *_quoted(_text_of(turn.instructions)), ""]
        lines += ["### Input", ""]
        lines += _items(turn.input) or ["(none)", ""]
        if turn.response_id is not None:
            lines += ["### Output", ""]
            lines += _items(turn.output) or ["(none yet)", ""]
    return "\n".join(lines).rstrip() + "\n"


def _items(items: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for item in items:
        view = describe(item)
        lines.append(f"**{view.title}**")
        lines.append("")
        if view.kind in ("call", "output", "other"):
            lines += [*_fenced(view.text), ""]
        elif view.text:
            lines += [*_quoted(view.text), ""]
    return lines


def _quoted(text: str) -> list[str]:
    return [f"> {line}".rstrip() for line in text.splitlines() or [""]]


def _fenced(text: str) -> list[str]:
    """A code block that no backtick run in ``text`` can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *text.splitlines(), fence]


def describe(item: dict[str, Any]) -> ItemView:
    kind = item.get("type") or ("message" if "role" in item else "item")
    call_id = item.get("call_id")
    suffix = f" ({call_id})" if call_id else ""
    if kind == "message":
        role = str(item.get("role", "message"))
        return ItemView("message", role, _text_of(item.get("content")))
    if kind == "reasoning":
        text = _text_of(item.get("content")) or _text_of(item.get("summary"))
        if not text and item.get("encrypted_content"):
            text = "(sealed: encrypted_content)"
        return ItemView("reasoning", "reasoning", text)
    if kind in ("function_call", "custom_tool_call"):
        name = ".".join(part for part in (item.get("namespace"), item.get("name")) if part)
        body = item.get("arguments") if kind == "function_call" else item.get("input")
        label = "tool call" if kind == "function_call" else "custom tool call"
        return ItemView("call", f"{label} {name}{suffix}", body if isinstance(body, str) else _compact(body))
    if kind.endswith("_output"):
        output = item.get("output")
        return ItemView("output", f"{kind.replace('_', ' ')}{suffix}",
                        output if isinstance(output, str) else _compact(output))
    rest = {key: value for key, value in item.items() if key not in ("type", "id", "status", "call_id")}
    return ItemView("other", f"{kind.replace('_', ' ')}{suffix}", _compact(rest))


def _text_of(content: Any) -> str:
    """The text of a message's content (a string, or parts), other parts named."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict):
                texts.append(f"[{part.get('type', 'part')}]")
            else:
                texts.append(str(part))
        return "\n".join(texts)
    return _compact(content)


def _compact(value: Any) -> str:
    return orjson.dumps(value).decode()
