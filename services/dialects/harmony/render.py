"""Renders a Responses request into the Harmony prompt for gpt-oss (pure).

System message: reasoning effort and conversation start date (no built-in tools: this
server does not run them). Developer message: ``instructions`` (plus any
``system``/``developer`` role input, plus what ``tool_choice`` asks), the function
tools (see ``services/dialects/tools.py``), those that input items add included, and
the ``text.format`` asked for (a "Response Formats" section). Then the input items, in
order."""

from __future__ import annotations

import datetime as dt
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import orjson
from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    ReasoningEffort,
    RenderOptions,
    Role,
    SystemContent,
    TextContent,
    ToolDescription,
)

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

# gpt-oss knows three efforts; every value the API allows maps onto one of them.
EFFORTS = {
    "none": ReasoningEffort.LOW,
    "minimal": ReasoningEffort.LOW,
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
    "xhigh": ReasoningEffort.HIGH,
    "max": ReasoningEffort.HIGH,
}
_TEXT_PART_TYPES = {"input_text", "output_text", "text", "reasoning_text", "summary_text"}
# A web_search_call action's type -> the browser command that makes it.
_BROWSER_COMMANDS = {"open_page": "open", "find_in_page": "find", "find": "find"}


def _text_of(content: Any, param: str) -> str:
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


def _call(recipient: str, arguments: str, channel: str = "commentary") -> Message:
    return (
        Message.from_role_and_content(Role.ASSISTANT, arguments)
        .with_channel(channel)
        .with_recipient(recipient)
        .with_content_type("json")
    )


def _tool_result(author: str, text: str) -> Message:
    return (
        Message.from_author_and_content(Author.new(Role.TOOL, author), text)
        .with_channel("commentary")
        .with_recipient("assistant")
    )


def _output_text(output: Any, param: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _text_of(output, param)
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
    rendered into the prompt's headers."""
    value = _required_str(item, key, param) if required else _optional_str(item, key, param)
    if value and not TOOL_NAME.match(value):
        raise InvalidInput(f"{key!r} must be 1-64 letters, digits, '_' or '-'", f"{param}.{key}")
    return value


def _input_messages(
    items: Sequence[dict[str, Any]], instructions: list[str], catalog: ToolCatalog, call_authors: dict[str, str],
    where: str = "input",
) -> list[Message]:
    """``call_authors`` maps call ids seen so far (in earlier turns too) to the tool
    that answers them."""
    messages: list[Message] = []
    for index, item in enumerate(items):
        param = f"{where}[{index}]"
        if not isinstance(item, dict):
            raise InvalidInput("an input item must be an object", param)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            text = _text_of(item.get("content"), f"{param}.content")
            if role in ("system", "developer"):
                instructions.append(text)
            elif role == "user":
                messages.append(Message.from_role_and_content(Role.USER, text))
            elif role == "assistant":
                channel = "commentary" if item.get("phase") == "commentary" else "final"
                messages.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel))
            else:
                raise InvalidInput(f"unsupported message role {role!r}", f"{param}.role")
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            text = _text_of(parts, f"{param}.content")
            messages.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis"))
        elif kind in ("function_call", "custom_tool_call"):
            call_id = _required_str(item, "call_id", param)
            namespace = _name(item, "namespace", param, required=False) or None
            name = catalog.qualified(_name(item, "name", param), namespace)
            if kind == "function_call":
                call_arguments = _optional_str(item, "arguments", param)
            else:
                call_arguments = orjson.dumps({CUSTOM_TOOL_INPUT_ARG: _optional_str(item, "input", param)}).decode()
            call_authors[call_id] = f"functions.{name}"
            messages.append(_call(f"functions.{name}", call_arguments))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            answered = item.get("call_id")
            author = call_authors.get(answered) if isinstance(answered, str) else None
            if author is None:
                raise InvalidInput(f"no tool call with call_id {answered!r} precedes this output", f"{param}.call_id")
            messages.append(_tool_result(author, _output_text(item.get("output"), f"{param}.output")))
        elif kind == "code_interpreter_call":
            code = _optional_str(item, "code", param)
            messages.append(_call("python", code, channel="analysis").with_content_type("code"))
        elif kind == "web_search_call":
            action = item.get("action") or {}
            if not isinstance(action, dict):
                raise InvalidInput("a web_search_call's action must be an object", f"{param}.action")
            command = _BROWSER_COMMANDS.get(str(action.get("type")), "search")
            arguments = {k: v for k, v in action.items() if k != "type"}
            messages.append(_call(f"browser.{command}", orjson.dumps(arguments).decode(), channel="analysis"))
        elif kind == "mcp_call":
            name = _name(item, "name", param)
            label = _name(item, "server_label", param, required=False) or name
            recipient = f"mcp.{name}" if label == name else name
            messages.append(_call(recipient, _optional_str(item, "arguments", param)))
            if item.get("output") is not None:
                messages.append(_tool_result(recipient, _output_text(item["output"], f"{param}.output")))
        elif kind == "tool_search_call":
            call_id = _optional_str(item, "call_id", param) or _UNNAMED_SEARCH
            call_authors[call_id] = f"functions.{TOOL_SEARCH}"
            messages.append(_call(f"functions.{TOOL_SEARCH}", orjson.dumps(item.get("arguments") or {}).decode()))
        elif kind == "tool_search_output":
            answered = _optional_str(item, "call_id", param) or _UNNAMED_SEARCH
            if answered not in call_authors:
                raise InvalidInput(f"no tool_search call with call_id {answered!r} precedes this output",
                                   f"{param}.call_id")
            loaded = [{"name": tool.get("name"), "description": tool.get("description")}
                      for tool in _tools_of(item, param)]
            messages.append(_tool_result(call_authors[answered], orjson.dumps(loaded).decode()))
        elif kind in _CLIENT_CALL_ARGUMENTS:
            call_id = _required_str(item, "call_id", param)
            name = _CLIENT_CALL_ARGUMENTS[kind][0]
            call_authors[call_id] = f"functions.{name}"
            arguments = _CLIENT_CALL_ARGUMENTS[kind][1](item, param)
            messages.append(_call(f"functions.{name}", orjson.dumps(arguments).decode()))
        elif kind in _CLIENT_CALL_OUTPUTS:
            answered = answered_call_id(item)
            author = call_authors.get(answered) if isinstance(answered, str) else None
            if author is None:
                raise InvalidInput(f"no tool call with call_id {answered!r} precedes this output", f"{param}.call_id")
            messages.append(_tool_result(author, _CLIENT_CALL_OUTPUTS[kind](item, param)))
        elif kind == "additional_tools":
            _tools_of(item, param)  # declared with the rest (see declared_tools)
        else:
            raise InvalidInput(f"unsupported input item type {kind!r}", f"{param}.type")
    return messages


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


# The call id of a tool search a client sent without one (the SDK makes it optional).
_UNNAMED_SEARCH = ""


def _tools_of(item: dict[str, Any], param: str) -> list[dict[str, Any]]:
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
                             for inner, tool in enumerate(_tools_of(item, f"{where}[{index}]"))]
    return declared


def build_conversation(
    request: CreateResponseRequest, created_at: int, history: Sequence[dict[str, Any]] = ()
) -> tuple[Conversation, ToolCatalog]:
    """``history``: the items of earlier turns (previous_response_id), oldest first."""
    declared = tool_catalog(declared_tools(request, history))
    # No tool calls allowed is no tools offered.
    choice = "none" if request.max_tool_calls == 0 else request.tool_choice
    offered, choice_instruction = apply_tool_choice(declared, choice)
    system = SystemContent.new().with_conversation_start_date(
        dt.datetime.fromtimestamp(created_at, dt.UTC).strftime("%Y-%m-%d")
    )
    effort = request.reasoning.effort if request.reasoning else None
    system = system.with_reasoning_effort(EFFORTS[effort or "medium"])
    instructions = [request.instructions] if request.instructions else []
    call_authors: dict[str, str] = {}
    # Instructions are not inherited from earlier turns.
    messages = _input_messages(history, [], declared, call_authors, where="history")
    if isinstance(request.input, str):
        messages.append(Message.from_role_and_content(Role.USER, request.input))
    else:
        messages += _input_messages(request.input, instructions, declared, call_authors)
    if choice_instruction:
        instructions.append(choice_instruction)
    conversation = [Message.from_role_and_content(Role.SYSTEM, system)]
    response_format = _response_format(request)
    if instructions or offered.functions or response_format:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions("\n\n".join(instructions))
        if offered.functions:
            developer = developer.with_function_tools([
                ToolDescription.new(tool.qualified_name, tool.description, _one_line_descriptions(tool.parameters))
                for tool in offered.functions.values()
            ])
        message = Message.from_role_and_content(Role.DEVELOPER, developer)
        if response_format:
            separator = "\n\n" if instructions or offered.functions else ""
            message = message.adding_content(TextContent(text=separator + response_format))
        conversation.append(message)
    return Conversation.from_messages(conversation + messages), offered


def _response_format(request: CreateResponseRequest) -> str:
    """The developer message's section on ``text.format``, as gpt-oss was taught it."""
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


def _one_line_descriptions(schema: Any) -> Any:
    """``schema`` with its parameters' descriptions on one line each: Harmony writes a
    parameter's description as a one-line comment, and a line break would end it."""
    if isinstance(schema, list):
        return [_one_line_descriptions(value) for value in schema]
    if not isinstance(schema, dict):
        return schema
    return {key: " ".join(value.split()) if key == "description" and isinstance(value, str)
            else _one_line_descriptions(value) for key, value in schema.items()}


# Rendered messages are reused: the system and developer messages are the same for most
# requests, a client that keeps its own history sends every earlier turn again, and
# Harmony pays a pass over its special tokens for every formatting token it renders
# (docs/performance.md). A message other than the system message (which holds no
# tenant's text) is reused only for the same tenant, so that no tenant's text serves (or
# times) another's request. A message larger than this is not kept, and all that is
# kept stays within a byte budget.
_REUSED_MAX_CHARS = 64 * 1024
_REUSED_MAX_BYTES = 8 * 1024 * 1024


class ConversationRenderer:
    """``encoding.render_conversation_for_completion(conversation, Role.ASSISTANT)``,
    message by message as Harmony does it, with messages rendered before reused."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._encoding = encoding
        self._completion_start = encoding.encode("<|start|>assistant", allowed_special="all")
        # (scope, message JSON, whether the conversation has function tools) -> tokens
        self._reused: OrderedDict[tuple[str, str, bool], array[int]] = OrderedDict()
        self._reused_bytes = 0

    def render(self, conversation: Conversation, reuse_scope: str = "") -> list[int]:
        messages = conversation.messages
        has_function_tools = any(
            isinstance(content, DeveloperContent) and content.tools and content.tools.get("functions")
            and content.tools["functions"].tools
            for message in messages for content in message.content
        )
        # Harmony's auto_drop_analysis: once the last assistant message is final, analysis
        # messages before the first final one are left out.
        last_assistant_is_final = next(
            (message.channel == "final" for message in reversed(messages) if message.author.role == Role.ASSISTANT),
            False,
        )
        first_final = next((i for i, message in enumerate(messages) if message.channel == "final"), None)
        tokens: list[int] = []
        for index, message in enumerate(messages):
            if last_assistant_is_final and first_final is not None and index < first_final \
                    and message.channel == "analysis":
                continue
            tokens += self._message(message, bool(has_function_tools), reuse_scope)
        return tokens + self._completion_start

    def _message(self, message: Message, has_function_tools: bool, reuse_scope: str) -> Sequence[int]:
        options = RenderOptions(conversation_has_function_tools=has_function_tools)
        text = message.to_json()
        if len(text) > _REUSED_MAX_CHARS:
            return self._encoding.render(message, options)
        key = ("" if message.author.role == Role.SYSTEM else reuse_scope, text, has_function_tools)
        tokens = self._reused.get(key)
        if tokens is not None:
            self._reused.move_to_end(key)
            return tokens
        tokens = array("I", self._encoding.render(message, options))
        self._reused[key] = tokens
        self._reused_bytes += _size(key, tokens)
        while self._reused_bytes > _REUSED_MAX_BYTES:
            self._reused_bytes -= _size(*self._reused.popitem(last=False))
        return tokens


def _size(key: tuple[str, str, bool], tokens: array[int]) -> int:
    return len(key[0]) + len(key[1]) + tokens.itemsize * len(tokens)
