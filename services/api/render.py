"""Renders a Responses request into the Harmony prompt for gpt-oss (pure).

System message: reasoning effort, conversation start date, built-in tools (browser
for web search, python for code interpreter). Developer message: ``instructions``
(plus any ``system``/``developer`` role input, plus what ``tool_choice`` asks) and the
function tools, namespaced ones as ``namespace.tool`` and custom (freeform) ones as a
function of one string parameter. Then the input items, in order."""

from __future__ import annotations

import datetime as dt
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
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
    ToolDescription,
)

from steno.schemas.api import CreateResponseRequest
from steno.schemas.responses import ParseContext

_EFFORTS = {
    "minimal": ReasoningEffort.LOW,
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
}
_TEXT_PART_TYPES = {"input_text", "output_text", "text", "reasoning_text", "summary_text"}
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_WEB_SEARCH_TOOLS = {"web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11"}
CUSTOM_TOOL_INPUT_ARG = "input"


class InvalidInput(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class ToolCatalog:
    """The tools a request offers, as the model will see them."""

    functions: dict[str, ToolDescription] = field(default_factory=dict)  # qualified name -> description
    custom: set[str] = field(default_factory=set)
    namespaces: set[str] = field(default_factory=set)
    browser: bool = False
    python: bool = False
    # Bare name -> qualified name, for replaying calls a client sent without namespace.
    qualified_by_bare: dict[str, str] = field(default_factory=dict)

    def parse_context(self, include_logprobs: bool) -> ParseContext:
        return ParseContext(
            include_logprobs=include_logprobs,
            function_tools=sorted(self.functions),
            custom_tools=sorted(self.custom),
            namespaces=sorted(self.namespaces),
        )

    def qualified(self, name: str, namespace: str | None) -> str:
        if namespace:
            return f"{namespace}.{name}"
        return self.qualified_by_bare.get(name, name)


def _custom_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    description = "The complete freeform input for this tool, passed through verbatim."
    fmt = tool.get("format") or {}
    if fmt.get("type") == "grammar":
        description += f" It must match this {fmt.get('syntax', '')} grammar:\n{fmt.get('definition', '')}"
    return {
        "type": "object",
        "properties": {CUSTOM_TOOL_INPUT_ARG: {"type": "string", "description": description}},
        "required": [CUSTOM_TOOL_INPUT_ARG],
    }


def _add_callable(catalog: ToolCatalog, tool: dict[str, Any], param: str, namespace: str | None) -> None:
    kind = tool.get("type")
    name = tool.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.match(name):
        raise InvalidInput("a tool name must be 1-64 letters, digits, '_' or '-'", f"{param}.name")
    qualified = f"{namespace}.{name}" if namespace else name
    if qualified in catalog.functions:
        raise InvalidInput(f"tool {qualified!r} is declared twice", f"{param}.name")
    if kind == "function":
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidInput("function parameters must be a JSON schema object", f"{param}.parameters")
        catalog.functions[qualified] = ToolDescription.new(qualified, tool.get("description") or "", parameters)
    elif kind == "custom":
        catalog.functions[qualified] = ToolDescription.new(
            qualified, tool.get("description") or "", _custom_parameters(tool)
        )
        catalog.custom.add(qualified)
    else:
        raise InvalidInput(f"unsupported tool type {kind!r}", f"{param}.type")
    if namespace:
        catalog.qualified_by_bare.setdefault(name, qualified)


def tool_catalog(tools: list[dict[str, Any]]) -> ToolCatalog:
    catalog = ToolCatalog()
    for index, tool in enumerate(tools):
        param = f"tools[{index}]"
        kind = tool.get("type")
        if kind in ("function", "custom"):
            _add_callable(catalog, tool, param, None)
        elif kind == "namespace":
            namespace = tool.get("name")
            if not isinstance(namespace, str) or not _TOOL_NAME.match(namespace):
                raise InvalidInput("a namespace needs a name of letters, digits, '_' or '-'", f"{param}.name")
            inner = tool.get("tools")
            if not isinstance(inner, list) or not inner:
                raise InvalidInput("a namespace needs a non-empty list of tools", f"{param}.tools")
            catalog.namespaces.add(namespace)
            for inner_index, inner_tool in enumerate(inner):
                if not isinstance(inner_tool, dict):
                    raise InvalidInput("a tool must be an object", f"{param}.tools[{inner_index}]")
                _add_callable(catalog, inner_tool, f"{param}.tools[{inner_index}]", namespace)
        elif kind in _WEB_SEARCH_TOOLS:
            catalog.browser = True
        elif kind == "code_interpreter":
            catalog.python = True
        else:
            raise InvalidInput(f"unsupported tool type {kind!r}", f"{param}.type")
    return catalog


def _apply_tool_choice(catalog: ToolCatalog, choice: str | dict[str, Any]) -> tuple[ToolCatalog, str | None]:
    """The tools actually offered, and an instruction saying what ``tool_choice`` asks."""
    if choice == "auto":
        return catalog, None
    if choice == "none":
        return ToolCatalog(), None
    if choice == "required":
        if not (catalog.functions or catalog.browser or catalog.python):
            raise InvalidInput("tool_choice 'required' needs at least one tool", "tool_choice")
        return catalog, "You must call one of the available tools before you answer."
    if not isinstance(choice, dict):
        raise InvalidInput(f"unsupported tool_choice {choice!r}", "tool_choice")
    kind = choice.get("type")
    if kind in ("function", "custom"):
        name = catalog.qualified(str(choice.get("name")), choice.get("namespace"))
        if name not in catalog.functions:
            raise InvalidInput(f"tool_choice names {name!r}, which is not among the tools", "tool_choice.name")
        only = ToolCatalog(
            functions={name: catalog.functions[name]},
            custom={name} & catalog.custom,
            namespaces=catalog.namespaces,
            qualified_by_bare=catalog.qualified_by_bare,
        )
        return only, f"You must call the tool `{name}`."
    if kind == "allowed_tools":
        allowed = ToolCatalog(namespaces=catalog.namespaces, qualified_by_bare=catalog.qualified_by_bare)
        for index, tool in enumerate(choice.get("tools") or []):
            tool_kind = tool.get("type") if isinstance(tool, dict) else None
            if tool_kind in _WEB_SEARCH_TOOLS:
                allowed.browser = catalog.browser
            elif tool_kind == "code_interpreter":
                allowed.python = catalog.python
            else:
                name = catalog.qualified(str(tool.get("name")), tool.get("namespace"))
                if name not in catalog.functions:
                    raise InvalidInput(f"{name!r} is not among the tools", f"tool_choice.tools[{index}]")
                allowed.functions[name] = catalog.functions[name]
                if name in catalog.custom:
                    allowed.custom.add(name)
        return _apply_tool_choice(allowed, "required" if choice.get("mode") == "required" else "auto")
    if kind in _WEB_SEARCH_TOOLS and catalog.browser:
        return catalog, "You must use the browser tool before you answer."
    if kind == "code_interpreter" and catalog.python:
        return catalog, "You must use the python tool before you answer."
    raise InvalidInput(f"unsupported tool_choice type {kind!r}", "tool_choice.type")


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
        if not isinstance(part, dict) or part.get("type") not in _TEXT_PART_TYPES or not isinstance(part.get("text"), str):
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


def _input_messages(
    items: list[dict[str, Any]], instructions: list[str], catalog: ToolCatalog, call_authors: dict[str, str]
) -> list[Message]:
    """``call_authors`` maps call ids seen so far (in earlier turns too) to the tool
    that answers them."""
    messages: list[Message] = []
    for index, item in enumerate(items):
        param = f"input[{index}]"
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
            name = catalog.qualified(_required_str(item, "name", param), item.get("namespace"))
            if kind == "function_call":
                arguments = item.get("arguments") or ""
            else:
                arguments = orjson.dumps({CUSTOM_TOOL_INPUT_ARG: item.get("input") or ""}).decode()
            call_authors[call_id] = f"functions.{name}"
            messages.append(_call(f"functions.{name}", str(arguments)))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = item.get("call_id")
            if call_id not in call_authors:
                raise InvalidInput(f"no tool call with call_id {call_id!r} precedes this output", f"{param}.call_id")
            messages.append(_tool_result(call_authors[call_id], _output_text(item.get("output"), f"{param}.output")))
        elif kind == "code_interpreter_call":
            messages.append(_call("python", item.get("code") or "", channel="analysis").with_content_type("code"))
        elif kind == "web_search_call":
            action = item.get("action") or {}
            command = {"open_page": "open", "find_in_page": "find", "find": "find"}.get(action.get("type"), "search")
            arguments = {k: v for k, v in action.items() if k != "type"}
            messages.append(_call(f"browser.{command}", orjson.dumps(arguments).decode(), channel="analysis"))
        elif kind == "mcp_call":
            name = _required_str(item, "name", param)
            label = item.get("server_label") or name
            recipient = f"mcp.{name}" if label == name else name
            messages.append(_call(recipient, item.get("arguments") or ""))
            if item.get("output") is not None:
                messages.append(_tool_result(recipient, _output_text(item["output"], f"{param}.output")))
        else:
            raise InvalidInput(f"unsupported input item type {kind!r}", f"{param}.type")
    return messages


@dataclass(frozen=True)
class RenderedPrompt:
    token_ids: list[int]
    parse_context: ParseContext


def build_conversation(
    request: CreateResponseRequest, created_at: int, history: list[dict[str, Any]] = ()
) -> tuple[Conversation, ToolCatalog]:
    """``history``: the items of earlier turns (previous_response_id), oldest first."""
    declared = tool_catalog(request.tools)
    offered, choice_instruction = _apply_tool_choice(declared, request.tool_choice)
    system = SystemContent.new().with_conversation_start_date(
        dt.datetime.fromtimestamp(created_at, dt.timezone.utc).strftime("%Y-%m-%d")
    )
    effort = request.reasoning.effort if request.reasoning else None
    system = system.with_reasoning_effort(_EFFORTS[effort or "medium"])
    if offered.browser:
        system = system.with_browser_tool()
    if offered.python:
        system = system.with_python_tool()
    instructions = [request.instructions] if request.instructions else []
    call_authors: dict[str, str] = {}
    # Instructions are not inherited from earlier turns.
    messages = _input_messages(list(history), [], declared, call_authors)
    if isinstance(request.input, str):
        messages.append(Message.from_role_and_content(Role.USER, request.input))
    else:
        messages += _input_messages(request.input, instructions, declared, call_authors)
    if choice_instruction:
        instructions.append(choice_instruction)
    conversation = [Message.from_role_and_content(Role.SYSTEM, system)]
    if instructions or offered.functions:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions("\n\n".join(instructions))
        if offered.functions:
            developer = developer.with_function_tools(list(offered.functions.values()))
        conversation.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    return Conversation.from_messages(conversation + messages), offered


def render_prompt(
    encoding: HarmonyEncoding,
    request: CreateResponseRequest,
    created_at: int,
    include_logprobs: bool = False,
    history: list[dict[str, Any]] = (),
) -> RenderedPrompt:
    conversation, offered = build_conversation(request, created_at, history)
    token_ids = render_for_completion(encoding, conversation)
    context = offered.parse_context(include_logprobs).model_copy(update={"prompt_tokens": len(token_ids)})
    return RenderedPrompt(token_ids, context)


# Rendered messages by (encoding, message JSON, whether the conversation has function
# tools). Harmony pays a pass over its ~1,100 special tokens for every formatting token
# it renders, so the system and developer messages, the same for most requests, cost
# more than the rest of a request's rendering; rendering them once saves about a tenth
# of the API's CPU per request (``steno bench``).
_RENDERED: OrderedDict[tuple[str, str, bool], list[int]] = OrderedDict()
_RENDERED_MAX = 512


def render_for_completion(encoding: HarmonyEncoding, conversation: Conversation) -> list[int]:
    """``encoding.render_conversation_for_completion(conversation, Role.ASSISTANT)``,
    message by message as Harmony does it, with messages rendered before reused."""
    messages = conversation.messages
    has_function_tools = any(
        isinstance(content, DeveloperContent) and content.tools and content.tools.get("functions")
        and content.tools["functions"].tools
        for message in messages for content in message.content
    )
    # Harmony's auto_drop_analysis: once the last assistant message is final, analysis
    # messages before the first final one are left out.
    last_assistant_is_final = next(
        (message.channel == "final" for message in reversed(messages) if message.author.role == Role.ASSISTANT), False
    )
    first_final = next((i for i, message in enumerate(messages) if message.channel == "final"), None)
    tokens: list[int] = []
    for index, message in enumerate(messages):
        if last_assistant_is_final and first_final is not None and index < first_final \
                and message.channel == "analysis":
            continue
        tokens += _rendered(encoding, message, bool(has_function_tools))
    return tokens + list(_completion_start_tokens(encoding))


def _rendered(encoding: HarmonyEncoding, message: Message, has_function_tools: bool) -> list[int]:
    key = (encoding.name, message.to_json(), has_function_tools)
    tokens = _RENDERED.get(key)
    if tokens is None:
        tokens = encoding.render(message, RenderOptions(conversation_has_function_tools=has_function_tools))
        _RENDERED[key] = tokens
        if len(_RENDERED) > _RENDERED_MAX:
            _RENDERED.popitem(last=False)
    else:
        _RENDERED.move_to_end(key)
    return tokens


@lru_cache(maxsize=4)
def _completion_start_tokens(encoding: HarmonyEncoding) -> tuple[int, ...]:
    return tuple(encoding.encode("<|start|>assistant", allowed_special="all"))
