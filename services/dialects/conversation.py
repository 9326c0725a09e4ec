"""A Responses conversation as turns every dialect renders (pure).

Input items (of the request and of earlier turns) are checked and read here once, into
turns that say who said what: the user's text, the assistant's text and reasoning, a
call (to a tool under its recipient, as the fragment vocabulary names it) and its
result. Each dialect then writes those turns in its model's format. ``system`` and
``developer`` messages of the input join the instructions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from steno.schemas.api import CreateResponseRequest
from steno.services.dialects.base import InvalidInput
from steno.services.dialects.tools import (
    CUSTOM_TOOL_INPUT_ARG,
    TOOL_NAME,
    TOOL_SEARCH,
    ToolCatalog,
    answered_call_id,
    apply_tool_choice,
    tool_catalog,
)

_TEXT_PART_TYPES = {"input_text", "output_text", "text", "reasoning_text", "summary_text"}
# A web_search_call action's type -> the browser command that makes it.
_BROWSER_COMMANDS = {"open_page": "open", "find_in_page": "find", "find": "find"}
# The call id of a tool search a client sent without one (the SDK makes it optional).
_UNNAMED_SEARCH = ""


@dataclass(frozen=True, slots=True)
class UserText:
    text: str


@dataclass(frozen=True, slots=True)
class AssistantText:
    text: str
    # A preamble said before calling tools, rather than the answer.
    commentary: bool = False


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    # ``functions.<qualified name>``, ``python``, ``browser.<command>``, ``mcp.<name>``...
    recipient: str
    arguments: str
    call_id: str | None = None
    # gpt-oss calls its built-in tools (python, the browser) while reasoning.
    channel: str = "commentary"
    content_type: str = "json"


@dataclass(frozen=True, slots=True)
class ToolResult:
    # The recipient of the call it answers.
    recipient: str
    text: str
    call_id: str | None = None


@dataclass(frozen=True, slots=True)
class UnknownItem:
    """An item of a type this server does not know: a dialect may replay its text or
    refuse it."""

    kind: str
    text: str | None
    param: str


Turn = UserText | AssistantText | Reasoning | ToolCall | ToolResult | UnknownItem


def text_of(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidInput("content must be a string or a list of content parts", param)
    texts = []
    for index, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
            continue
        if not isinstance(part, dict) or part.get("type") not in _TEXT_PART_TYPES \
                or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InvalidInput(f"unsupported content part type {kind!r}", f"{param}[{index}]")
        texts.append(part["text"])
    return "".join(texts)


def _output_text(output: Any, param: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return text_of(output, param)
    return orjson.dumps(output).decode()


def _required_str(item: dict[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{item.get('type')} items need a {key!r} string", f"{param}.{key}")
    return value


def _optional_str(item: dict[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidInput(f"{key!r} of {item.get('type')} items must be a string", f"{param}.{key}")
    return value


def _name(item: dict[str, Any], key: str, param: str, required: bool = True) -> str:
    """A tool, namespace or server name, checked as declared tool names are: it is
    rendered into the prompt."""
    value = _required_str(item, key, param) if required else _optional_str(item, key, param)
    if value and not TOOL_NAME.match(value):
        raise InvalidInput(f"{key!r} must be 1-64 letters, digits, '_' or '-'", f"{param}.{key}")
    return value


def _answering(call_authors: dict[str, str], answered: Any, param: str) -> str:
    author = call_authors.get(answered) if isinstance(answered, str) else None
    if author is None:
        raise InvalidInput(f"no tool call with call_id {answered!r} precedes this output", f"{param}.call_id")
    return author


def _unknown_text(item: dict[str, Any]) -> str | None:
    """The text an unknown item carries, if any: its content, output or text."""
    for key in ("content", "output", "text"):
        value = item.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, list):
            texts = [part["text"] for part in value if isinstance(part, dict) and isinstance(part.get("text"), str)]
            if texts:
                return "".join(texts)
    return None


def read_items(
    items: Sequence[Any], instructions: list[str], catalog: ToolCatalog, call_authors: dict[str, str],
    where: str = "input",
) -> list[Turn]:
    """The turns of ``items``; ``system``/``developer`` messages are appended to
    ``instructions``. ``call_authors`` maps call ids seen so far (in earlier turns too)
    to the recipient of the call, which answers them."""
    turns: list[Turn] = []
    for index, item in enumerate(items):
        param = f"{where}[{index}]"
        if not isinstance(item, dict):
            raise InvalidInput("an input item must be an object", param)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            text = text_of(item.get("content"), f"{param}.content")
            if role in ("system", "developer"):
                instructions.append(text)
            elif role == "user":
                turns.append(UserText(text))
            elif role == "assistant":
                turns.append(AssistantText(text, commentary=item.get("phase") == "commentary"))
            else:
                raise InvalidInput(f"unsupported message role {role!r}", f"{param}.role")
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            turns.append(Reasoning(text_of(parts, f"{param}.content")))
        elif kind in ("function_call", "custom_tool_call"):
            call_id = _required_str(item, "call_id", param)
            namespace = _name(item, "namespace", param, required=False) or None
            name = catalog.qualified(_name(item, "name", param), namespace)
            if kind == "function_call":
                call_arguments = _optional_str(item, "arguments", param)
            else:
                call_arguments = orjson.dumps({CUSTOM_TOOL_INPUT_ARG: _optional_str(item, "input", param)}).decode()
            call_authors[call_id] = f"functions.{name}"
            turns.append(ToolCall(f"functions.{name}", call_arguments, call_id))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            answered = item.get("call_id")
            author = _answering(call_authors, answered, param)
            turns.append(ToolResult(author, _output_text(item.get("output"), f"{param}.output"), answered))
        elif kind == "code_interpreter_call":
            code = _optional_str(item, "code", param)
            turns.append(ToolCall("python", code, item.get("id"), channel="analysis", content_type="code"))
        elif kind == "web_search_call":
            action = item.get("action") or {}
            if not isinstance(action, dict):
                raise InvalidInput("a web_search_call's action must be an object", f"{param}.action")
            command = _BROWSER_COMMANDS.get(str(action.get("type")), "search")
            arguments = {k: v for k, v in action.items() if k != "type"}
            turns.append(ToolCall(f"browser.{command}", orjson.dumps(arguments).decode(), item.get("id"),
                                  channel="analysis"))
        elif kind == "mcp_call":
            name = _name(item, "name", param)
            label = _name(item, "server_label", param, required=False) or name
            recipient = f"mcp.{name}" if label == name else name
            turns.append(ToolCall(recipient, _optional_str(item, "arguments", param), item.get("id")))
            if item.get("output") is not None:
                turns.append(ToolResult(recipient, _output_text(item["output"], f"{param}.output"), item.get("id")))
        elif kind == "tool_search_call":
            call_id = _optional_str(item, "call_id", param) or _UNNAMED_SEARCH
            call_authors[call_id] = f"functions.{TOOL_SEARCH}"
            turns.append(ToolCall(f"functions.{TOOL_SEARCH}", orjson.dumps(item.get("arguments") or {}).decode(),
                                  call_id))
        elif kind == "tool_search_output":
            answered = _optional_str(item, "call_id", param) or _UNNAMED_SEARCH
            if answered not in call_authors:
                raise InvalidInput(f"no tool_search call with call_id {answered!r} precedes this output",
                                   f"{param}.call_id")
            loaded = [{"name": tool.get("name"), "description": tool.get("description")}
                      for tool in tools_of(item, param)]
            turns.append(ToolResult(call_authors[answered], orjson.dumps(loaded).decode(), answered))
        elif kind in _CLIENT_CALL_ARGUMENTS:
            call_id = _required_str(item, "call_id", param)
            name = _CLIENT_CALL_ARGUMENTS[kind][0]
            call_authors[call_id] = f"functions.{name}"
            arguments = _CLIENT_CALL_ARGUMENTS[kind][1](item, param)
            turns.append(ToolCall(f"functions.{name}", orjson.dumps(arguments).decode(), call_id))
        elif kind in _CLIENT_CALL_OUTPUTS:
            answered = answered_call_id(item)
            author = _answering(call_authors, answered, param)
            turns.append(ToolResult(author, _CLIENT_CALL_OUTPUTS[kind](item, param), answered))
        elif kind == "additional_tools":
            tools_of(item, param)  # declared with the rest (see declared_tools)
        else:
            turns.append(UnknownItem(str(kind), _unknown_text(item), param))
    return turns


def _object(item: dict[str, Any], key: str, param: str) -> dict[str, Any]:
    value = item.get(key)
    if not isinstance(value, dict):
        raise InvalidInput(f"{item.get('type')} items need an {key!r} object", f"{param}.{key}")
    return value


def _shell_arguments(item: dict[str, Any], param: str) -> dict[str, Any]:
    action = _object(item, "action", param)
    return {key: action[key] for key in ("commands", "timeout_ms", "max_output_length") if action.get(key) is not None}


def _local_shell_arguments(item: dict[str, Any], param: str) -> dict[str, Any]:
    action = _object(item, "action", param)
    return {key: action[key] for key in ("command", "working_directory", "timeout_ms", "env")
            if action.get(key) is not None}


def _patch_arguments(item: dict[str, Any], param: str) -> dict[str, Any]:
    return dict(_object(item, "operation", param))


# A client-run built-in tool's call item -> the function it was offered as and its
# arguments; its output item -> the result's text.
_CLIENT_CALL_ARGUMENTS = {
    "shell_call": ("shell", _shell_arguments),
    "local_shell_call": ("local_shell", _local_shell_arguments),
    "apply_patch_call": ("apply_patch", _patch_arguments),
}
_CLIENT_CALL_OUTPUTS = {
    "shell_call_output": lambda item, param: orjson.dumps(item.get("output")).decode(),
    "local_shell_call_output": lambda item, param: _optional_str(item, "output", param),
    "apply_patch_call_output": lambda item, param: orjson.dumps(
        {"status": item.get("status"), "output": item.get("output")}).decode(),
}


def tools_of(item: dict[str, Any], param: str) -> list[dict[str, Any]]:
    tools = item.get("tools")
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise InvalidInput(f"{item.get('type')} items need a list of tools", f"{param}.tools")
    return tools


def declared_tools(request: CreateResponseRequest, history: Sequence[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Every tool the conversation declares, with where: the request's, then those that
    input items added (``additional_tools``, a tool search's loaded tools), earlier
    turns' included."""
    declared: list[tuple[str, Any]] = [(f"tools[{index}]", tool) for index, tool in enumerate(request.tools)]
    items = [("history", list(history)), ("input", request.input if isinstance(request.input, list) else [])]
    for where, listed in items:
        for index, item in enumerate(listed):
            if isinstance(item, dict) and item.get("type") in ("additional_tools", "tool_search_output"):
                declared += [(f"{where}[{index}].tools[{inner}]", tool)
                             for inner, tool in enumerate(tools_of(item, f"{where}[{index}]"))]
    return declared


@dataclass(frozen=True)
class ConversationTurns:
    """A request with its history, read: what every dialect renders."""

    # The request's instructions, system/developer input and what tool_choice asks.
    instructions: list[str]
    turns: list[Turn]
    # Every tool the conversation declares, and those offered after tool_choice.
    declared: ToolCatalog
    offered: ToolCatalog


def read_conversation(request: CreateResponseRequest, history: Sequence[dict[str, Any]] = ()) -> ConversationTurns:
    """``history``: the items of earlier turns (previous_response_id), oldest first."""
    declared = tool_catalog(declared_tools(request, history))
    # No tool calls allowed is no tools offered.
    choice = "none" if request.max_tool_calls == 0 else request.tool_choice
    offered, choice_instruction = apply_tool_choice(declared, choice)
    instructions = [request.instructions] if request.instructions else []
    call_authors: dict[str, str] = {}
    # Instructions are not inherited from earlier turns.
    turns = read_items(history, [], declared, call_authors, where="history")
    if isinstance(request.input, str):
        turns.append(UserText(request.input))
    else:
        turns += read_items(request.input, instructions, declared, call_authors)
    if choice_instruction:
        instructions.append(choice_instruction)
    return ConversationTurns(instructions, turns, declared, offered)


def response_format_section(request: CreateResponseRequest) -> str:
    """What the prompt says of ``text.format``, as gpt-oss was taught it (other models
    read it as plain instructions)."""
    fmt = request.text.format if request.text else None
    if not fmt or fmt.get("type") not in ("json_schema", "json_object"):
        return ""
    name: str = "json_object"
    description: Any = "A JSON object."
    schema: Any = {"type": "object"}
    if fmt["type"] == "json_schema":
        name = " ".join(str(fmt.get("name") or "response").split())
        description, schema = fmt.get("description"), fmt.get("schema")
    comment = "".join(f"// {line}\n" for line in description.splitlines()) if isinstance(description, str) else ""
    return f"# Response Formats\n\n## {name}\n\n{comment}{orjson.dumps(schema).decode()}"
