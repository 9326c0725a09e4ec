"""Renders a Responses request into the Harmony prompt for gpt-oss (pure).

System message: reasoning effort and conversation start date. Developer message:
``instructions`` (plus any ``system``/``developer`` role input) and function tools.
Then the input items, in order."""

from __future__ import annotations

import datetime as dt
from typing import Any

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
)

from schemas.api import CreateResponseRequest

_EFFORTS = {
    "minimal": ReasoningEffort.LOW,
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
}
_TEXT_PART_TYPES = {"input_text", "output_text", "text", "reasoning_text", "summary_text"}


class InvalidInput(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _text_of(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidInput("content must be a string or a list of content parts", param)
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in _TEXT_PART_TYPES or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InvalidInput(f"unsupported content part type {kind!r}", f"{param}[{index}]")
        texts.append(part["text"])
    return "".join(texts)


def _function_tools(tools: list[dict[str, Any]]) -> list[ToolDescription]:
    described = []
    for index, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise InvalidInput(f"unsupported tool type {tool.get('type')!r}", f"tools[{index}].type")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput("a function tool needs a name", f"tools[{index}].name")
        described.append(ToolDescription.new(name, tool.get("description") or "", tool.get("parameters")))
    return described


def _input_messages(items: list[dict[str, Any]], instructions: list[str]) -> list[Message]:
    messages: list[Message] = []
    call_names: dict[str, str] = {}
    for index, item in enumerate(items):
        param = f"input[{index}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            text = _text_of(item.get("content"), f"{param}.content")
            if role in ("system", "developer"):
                instructions.append(text)
            elif role == "user":
                messages.append(Message.from_role_and_content(Role.USER, text))
            elif role == "assistant":
                messages.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("final"))
            else:
                raise InvalidInput(f"unsupported message role {role!r}", f"{param}.role")
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            messages.append(
                Message.from_role_and_content(Role.ASSISTANT, _text_of(parts, f"{param}.content")).with_channel(
                    "analysis"
                )
            )
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise InvalidInput("a function_call item needs name and call_id", param)
            call_names[call_id] = name
            messages.append(
                Message.from_role_and_content(Role.ASSISTANT, str(item.get("arguments", "")))
                .with_channel("commentary")
                .with_recipient(f"functions.{name}")
                .with_content_type("json")
            )
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if call_id not in call_names:
                raise InvalidInput(f"no function_call with call_id {call_id!r} precedes this output", f"{param}.call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, f"{param}.output")
            messages.append(
                Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{call_names[call_id]}"), text)
                .with_channel("commentary")
                .with_recipient("assistant")
            )
        else:
            raise InvalidInput(f"unsupported input item type {kind!r}", f"{param}.type")
    return messages


def build_conversation(request: CreateResponseRequest, created_at: int) -> Conversation:
    system = SystemContent.new().with_conversation_start_date(
        dt.datetime.fromtimestamp(created_at, dt.timezone.utc).strftime("%Y-%m-%d")
    )
    effort = request.reasoning.effort if request.reasoning else None
    system = system.with_reasoning_effort(_EFFORTS[effort or "medium"])
    instructions = [request.instructions] if request.instructions else []
    if isinstance(request.input, str):
        messages = [Message.from_role_and_content(Role.USER, request.input)]
    else:
        messages = _input_messages(request.input, instructions)
    tools = _function_tools(request.tools)
    conversation = [Message.from_role_and_content(Role.SYSTEM, system)]
    if instructions or tools:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions("\n\n".join(instructions))
        if tools:
            developer = developer.with_function_tools(tools)
        conversation.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    return Conversation.from_messages(conversation + messages)


def render_prompt(encoding: HarmonyEncoding, request: CreateResponseRequest, created_at: int) -> list[int]:
    return encoding.render_conversation_for_completion(build_conversation(request, created_at), Role.ASSISTANT)
