"""Renders a Responses request into a chat-template model's prompt (pure).

The conversation (``services/dialects/conversation.py``) becomes chat messages as
vLLM's and TensorRT-LLM's servers build them: the instructions as the system message
(the head of the first user message where the template has no system role, found by
rendering a probe); earlier turns replayed without their reasoning, but a tool loop
under way keeps its reasoning as the assistant's ``reasoning_content``, which templates
that know it render; consecutive assistant text and calls folded into one assistant
message, each call's output a tool message matched by call id; an item of an unknown
type replayed as user text where it has text. Tools are offered in the chat shape under
their qualified names (``namespace.name``), a custom tool as a function of one string
parameter. ``reasoning.effort`` becomes the family's template arguments."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from steno.schemas.api import CreateResponseRequest
from steno.services.dialects.conversation import (
    AssistantText,
    ConversationTurns,
    Reasoning,
    ToolCall,
    ToolResult,
    UserText,
    read_conversation,
    response_format_section,
)
from steno.services.dialects.tools import ToolCatalog

FUNCTION_PREFIX = "functions."


@dataclass
class ChatConversation:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    offered: ToolCatalog
    # Qualified name -> parameter -> JSON schema type (for formats that write values as text).
    parameter_types: dict[str, dict[str, str]] = field(default_factory=dict)


def _tool_name(recipient: str) -> str:
    return recipient.removeprefix(FUNCTION_PREFIX)


def _arguments(text: str) -> Any:
    """A call's arguments as the template wants them: most templates write them with
    ``tojson``, so an object; text that is not JSON stays text."""
    try:
        return orjson.loads(text) if text else {}
    except orjson.JSONDecodeError:
        return text


def _chat_messages(read: ConversationTurns) -> list[dict[str, Any]]:
    turns = read.turns
    last_user = max((i for i, turn in enumerate(turns) if isinstance(turn, UserText)), default=-1)
    messages: list[dict[str, Any]] = []
    # The assistant message being folded together (text, reasoning, calls), if any.
    assistant: dict[str, Any] | None = None

    def assistant_message() -> dict[str, Any]:
        nonlocal assistant
        if assistant is None:
            assistant = {"role": "assistant", "content": ""}
            messages.append(assistant)
        return assistant

    for index, turn in enumerate(turns):
        if isinstance(turn, AssistantText):
            current = assistant_message()
            if current.get("tool_calls"):  # text after calls starts the next message
                assistant = None
                current = assistant_message()
            current["content"] += turn.text
        elif isinstance(turn, Reasoning):
            # Earlier turns' reasoning is not replayed; a tool loop under way keeps it.
            if index > last_user:
                current = assistant_message()
                current["reasoning_content"] = current.get("reasoning_content", "") + turn.text
        elif isinstance(turn, ToolCall):
            call = {"id": turn.call_id or f"call{index:09d}", "type": "function",
                    "function": {"name": _tool_name(turn.recipient), "arguments": _arguments(turn.arguments)}}
            assistant_message().setdefault("tool_calls", []).append(call)
        elif isinstance(turn, ToolResult):
            assistant = None
            messages.append({"role": "tool", "tool_call_id": turn.call_id or "", "name": _tool_name(turn.recipient),
                             "content": turn.text})
        else:  # the user's text, or an unknown item's (one without text is left out)
            assistant = None
            if turn.text is not None:
                messages.append({"role": "user", "content": turn.text})
    return messages


def _parameter_types(parameters: dict[str, Any] | None) -> dict[str, str]:
    properties = (parameters or {}).get("properties")
    if not isinstance(properties, dict):
        return {}
    return {name: schema["type"] for name, schema in properties.items()
            if isinstance(schema, dict) and isinstance(schema.get("type"), str)}


def build_chat(request: CreateResponseRequest, history: Sequence[dict[str, Any]], roles: frozenset[str]) -> \
        ChatConversation:
    """The chat messages and tools for ``request`` after ``history``; ``roles``: the roles
    the template renders (``system`` or not)."""
    read = read_conversation(request, history)
    messages = _chat_messages(read)
    system_text = "\n\n".join([*read.instructions, *filter(None, [response_format_section(request)])])
    if system_text:
        if "system" in roles:
            messages.insert(0, {"role": "system", "content": system_text})
        else:
            first_user = next((m for m in messages if m["role"] == "user"), None)
            if first_user is None:
                messages.insert(0, {"role": "user", "content": system_text})
            else:
                first_user["content"] = f"{system_text}\n\n{first_user['content']}"
    tools = [{"type": "function", "function": {
        "name": tool.qualified_name, "description": tool.description,
        "parameters": tool.parameters or {"type": "object", "properties": {}}}}
        for tool in read.offered.functions.values()]
    types = {tool.qualified_name: _parameter_types(tool.parameters) for tool in read.offered.functions.values()}
    return ChatConversation(messages, tools, read.offered, {name: kinds for name, kinds in types.items() if kinds})
