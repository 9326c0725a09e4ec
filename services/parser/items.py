"""Output item kinds: how each opens, streams and closes as Responses events (pure).

Every kind receives ``emit(type, body)`` to append an event, its output index and its
derived ids. Which kind a message becomes (in the dialects' fragment vocabulary,
``services/dialects/base.py``) is decided in ``classify``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import orjson

from steno.schemas.events import EventType
from steno.schemas.ids import derived_id
from steno.schemas.responses import LOG_FORMAT_PART_LOGPROBS, ParseContext
from steno.services.dialects.tools import CUSTOM_TOOL_INPUT_ARG, TOOL_SEARCH

Emit = Callable[[EventType, dict[str, Any]], None]
# (reasoning text, item id) -> the text sealed (services/common/reasoning_seal.py).
ReasoningSealer = Callable[[str, str], str]

# Server labels for built-in tools reported as MCP calls (vLLM's convention).
_BUILTIN_SERVER_LABELS = {"python": "code_interpreter", "container": "container", "browser": "web_search_preview"}


class OutputItem:
    prefix = "item"

    def __init__(self, response_id: str, output_index: int) -> None:
        self.output_index = output_index
        self.id = derived_id(self.prefix, response_id, output_index)
        self.text: list[str] = []
        self.item: dict[str, Any] = {}

    @property
    def address(self) -> dict[str, Any]:
        return {"item_id": self.id, "output_index": self.output_index}

    def open(self, emit: Emit) -> None:
        emit("response.output_item.added", {"output_index": self.output_index, "item": dict(self.item)})

    def delta(self, emit: Emit, text: str, logprobs: list[dict[str, Any]]) -> None:
        self.text.append(text)

    def close(self, emit: Emit, status: str) -> None:
        emit("response.output_item.done", {"output_index": self.output_index, "item": dict(self.item)})

    @property
    def full_text(self) -> str:
        return "".join(self.text)


class _TextPartItem(OutputItem):
    """Reasoning and message items: one content part streamed as text deltas."""

    part_type: ClassVar[str]
    delta_type: ClassVar[EventType]
    done_type: ClassVar[EventType]

    @property
    def part_address(self) -> dict[str, Any]:
        return {**self.address, "content_index": 0}

    def part(self, text: str) -> dict[str, Any]:
        return {"type": self.part_type, "text": text}

    def open(self, emit: Emit) -> None:
        super().open(emit)
        emit("response.content_part.added", {**self.part_address, "part": self.part("")})

    def delta(self, emit: Emit, text: str, logprobs: list[dict[str, Any]]) -> None:
        super().delta(emit, text, logprobs)
        emit(self.delta_type, {**self.part_address, "delta": text})

    def done_body(self, text: str) -> dict[str, Any]:
        return {**self.part_address, "text": text}

    def close(self, emit: Emit, status: str) -> None:
        text = self.full_text
        emit(self.done_type, self.done_body(text))
        part = self.part(text)
        emit("response.content_part.done", {**self.part_address, "part": part})
        self.item["content"] = [part]
        self.item["status"] = status
        super().close(emit, status)


class ReasoningItem(_TextPartItem):
    prefix = "rs"
    part_type = "reasoning_text"
    delta_type = "response.reasoning_text.delta"
    done_type = "response.reasoning_text.done"

    def __init__(self, response_id: str, output_index: int, seal: ReasoningSealer | None = None) -> None:
        """``seal``: the item carries its text sealed as ``encrypted_content`` too."""
        super().__init__(response_id, output_index)
        self._seal = seal
        self.item = {"id": self.id, "type": "reasoning", "status": "in_progress", "summary": [], "content": []}

    def close(self, emit: Emit, status: str) -> None:
        if self._seal is not None:
            self.item["encrypted_content"] = self._seal(self.full_text, self.id)
        super().close(emit, status)


class MessageItem(_TextPartItem):
    prefix = "msg"
    part_type = "output_text"
    delta_type = "response.output_text.delta"
    done_type = "response.output_text.done"

    def __init__(self, response_id: str, output_index: int, phase: str, with_logprobs: bool,
                 part_logprobs: bool) -> None:
        """``part_logprobs``: the parts carry a ``logprobs`` list even when none were asked
        for (as OpenAI's do); logs written before they did must re-parse without it."""
        super().__init__(response_id, output_index)
        self.with_logprobs = with_logprobs
        self._part_logprobs = part_logprobs or with_logprobs
        self.logprobs: list[dict[str, Any]] = []
        self.item = {
            "id": self.id, "type": "message", "status": "in_progress", "role": "assistant", "phase": phase,
            "content": [],
        }

    def part(self, text: str) -> dict[str, Any]:
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
        if self._part_logprobs:
            part["logprobs"] = list(self.logprobs) if text else []
        return part

    def delta(self, emit: Emit, text: str, logprobs: list[dict[str, Any]]) -> None:
        self.text.append(text)
        self.logprobs.extend(logprobs)
        emit(self.delta_type, {**self.part_address, "delta": text, "logprobs": list(logprobs)})

    def done_body(self, text: str) -> dict[str, Any]:
        return {**self.part_address, "text": text, "logprobs": list(self.logprobs)}


def _split_namespace(name: str, context: ParseContext) -> tuple[str | None, str]:
    namespace, dot, bare = name.partition(".")
    if dot and namespace in context.namespaces:
        return namespace, bare
    return None, name


class FunctionCallItem(OutputItem):
    prefix = "fc"

    def __init__(self, response_id: str, output_index: int, name: str, context: ParseContext) -> None:
        super().__init__(response_id, output_index)
        namespace, bare = _split_namespace(name, context)
        self.item = {
            "id": self.id, "type": "function_call", "status": "in_progress",
            "call_id": derived_id("call", response_id, output_index), "name": bare, "arguments": "",
        }
        if namespace:
            self.item["namespace"] = namespace

    def delta(self, emit: Emit, text: str, logprobs: list[dict[str, Any]]) -> None:
        super().delta(emit, text, logprobs)
        emit("response.function_call_arguments.delta", {**self.address, "delta": text})

    def close(self, emit: Emit, status: str) -> None:
        # Arguments that are not valid JSON are reported as the model wrote them.
        arguments = self.full_text
        emit("response.function_call_arguments.done", {**self.address, "arguments": arguments})
        self.item["arguments"] = arguments
        self.item["status"] = status
        super().close(emit, status)


def unwrap_custom_input(arguments: str) -> str:
    """The freeform input of a custom tool call, offered as one string parameter.

    A model that answered with something else still has its payload forwarded verbatim."""
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(parsed, dict):
        if CUSTOM_TOOL_INPUT_ARG in parsed:
            value = parsed[CUSTOM_TOOL_INPUT_ARG]
        elif len(parsed) == 1:
            value = next(iter(parsed.values()))
        else:
            return arguments
        return value if isinstance(value, str) else orjson.dumps(value).decode()
    return arguments


class CustomToolCallItem(OutputItem):
    """Streams nothing until the call closes: the model writes JSON around the input,
    and only the unwrapped input is the client's business."""

    prefix = "ctc"

    def __init__(self, response_id: str, output_index: int, name: str, context: ParseContext) -> None:
        super().__init__(response_id, output_index)
        namespace, bare = _split_namespace(name, context)
        self.item = {
            "id": self.id, "type": "custom_tool_call", "call_id": derived_id("call", response_id, output_index),
            "name": bare, "input": "",
        }
        if namespace:
            self.item["namespace"] = namespace

    def close(self, emit: Emit, status: str) -> None:
        payload = unwrap_custom_input(self.full_text)
        if payload:
            emit("response.custom_tool_call_input.delta", {**self.address, "delta": payload})
        emit("response.custom_tool_call_input.done", {**self.address, "input": payload})
        self.item["input"] = payload
        super().close(emit, status)


class CodeInterpreterCallItem(OutputItem):
    prefix = "ci"

    def __init__(self, response_id: str, output_index: int) -> None:
        super().__init__(response_id, output_index)
        self.item = {
            "id": self.id, "type": "code_interpreter_call", "status": "in_progress", "code": "",
            "container_id": "auto", "outputs": None,
        }

    def open(self, emit: Emit) -> None:
        super().open(emit)
        emit("response.code_interpreter_call.in_progress", dict(self.address))

    def delta(self, emit: Emit, text: str, logprobs: list[dict[str, Any]]) -> None:
        super().delta(emit, text, logprobs)
        emit("response.code_interpreter_call_code.delta", {**self.address, "delta": text})

    def close(self, emit: Emit, status: str) -> None:
        code = self.full_text
        emit("response.code_interpreter_call_code.done", {**self.address, "code": code})
        if status == "completed":
            emit("response.code_interpreter_call.interpreting", dict(self.address))
            emit("response.code_interpreter_call.completed", dict(self.address))
        # Steno does not run the code: no outputs.
        self.item.update(code=code, outputs=[], status=status)
        super().close(emit, status)


class McpCallItem(OutputItem):
    prefix = "mcp"

    def __init__(self, response_id: str, output_index: int, recipient: str) -> None:
        super().__init__(response_id, output_index)
        if recipient.startswith("mcp."):
            name = label = recipient.removeprefix("mcp.")
        else:
            name, label = recipient, _BUILTIN_SERVER_LABELS.get(recipient.split(".", 1)[0], recipient)
        self.item = {
            "id": self.id, "type": "mcp_call", "status": "in_progress", "name": name, "server_label": label,
            "arguments": "",
        }

    def open(self, emit: Emit) -> None:
        super().open(emit)
        emit("response.mcp_call.in_progress", dict(self.address))

    def delta(self, emit: Emit, text: str, logprobs: list[dict[str, Any]]) -> None:
        super().delta(emit, text, logprobs)
        emit("response.mcp_call_arguments.delta", {**self.address, "delta": text})

    def close(self, emit: Emit, status: str) -> None:
        arguments = self.full_text
        emit("response.mcp_call_arguments.done", {**self.address, "arguments": arguments})
        emit("response.mcp_call.completed" if status == "completed" else "response.mcp_call.failed", dict(self.address))
        self.item.update(arguments=arguments, status="completed" if status == "completed" else "incomplete")
        super().close(emit, status)


def web_search_action(command: str, arguments: str) -> dict[str, Any]:
    """The action of a ``browser.<command>`` call, from the model's JSON arguments."""
    try:
        args = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        args = None
    if not isinstance(args, dict):
        return {"type": "search", "query": arguments}
    cursor = args.get("cursor", "")
    if command == "open":
        target = args.get("id")
        url = target if isinstance(target, str) and "://" in target else f"cursor:{cursor}"
        return {"type": "open_page", "url": url}
    if command == "find":
        return {"type": "find_in_page", "pattern": str(args.get("pattern", "")), "url": f"cursor:{cursor}"}
    query = args.get("query")
    return {"type": "search", "query": query if isinstance(query, str) else arguments}


class WebSearchCallItem(OutputItem):
    """A browser call is reported whole when its arguments are complete."""

    prefix = "ws"

    def __init__(self, response_id: str, output_index: int, command: str) -> None:
        super().__init__(response_id, output_index)
        self.command = command

    def open(self, emit: Emit) -> None:
        pass

    def close(self, emit: Emit, status: str) -> None:
        action = web_search_action(self.command, self.full_text)
        self.item = {"id": self.id, "type": "web_search_call", "status": "in_progress", "action": action}
        super().open(emit)
        if status == "completed":
            emit("response.web_search_call.in_progress", dict(self.address))
            emit("response.web_search_call.searching", dict(self.address))
            emit("response.web_search_call.completed", dict(self.address))
        self.item["status"] = status
        super().close(emit, status)


WEB_SEARCH_COMMANDS = frozenset({"search", "open", "find"})


class ToolSearchCallItem(OutputItem):
    """A call of a client-executed tool search, reported whole when its arguments are
    complete (the SDK streams no part of one)."""

    prefix = "ts"

    def __init__(self, response_id: str, output_index: int) -> None:
        super().__init__(response_id, output_index)
        self.call_id = derived_id("call", response_id, output_index)

    def open(self, emit: Emit) -> None:
        pass

    def close(self, emit: Emit, status: str) -> None:
        try:
            arguments = orjson.loads(self.full_text)
        except orjson.JSONDecodeError:
            arguments = self.full_text  # reported as the model wrote them
        self.item = {"id": self.id, "type": "tool_search_call", "call_id": self.call_id, "arguments": arguments,
                     "execution": "client", "status": "in_progress"}
        super().open(emit)
        self.item["status"] = status
        super().close(emit, status)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(part, str) for part in value)


def _optional_int(arguments: dict[str, Any], key: str) -> int | None:
    value = arguments.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _shell_call(arguments: dict[str, Any]) -> dict[str, Any] | None:
    if not _strings(arguments.get("commands")):
        return None
    return {"type": "shell_call", "action": {
        "commands": arguments["commands"], "timeout_ms": _optional_int(arguments, "timeout_ms"),
        "max_output_length": _optional_int(arguments, "max_output_length")}}


def _local_shell_call(arguments: dict[str, Any]) -> dict[str, Any] | None:
    env = arguments.get("env") or {}
    if not _strings(arguments.get("command")) or not isinstance(env, dict) \
            or not all(isinstance(value, str) for value in env.values()):
        return None
    directory = arguments.get("working_directory")
    return {"type": "local_shell_call", "action": {
        "type": "exec", "command": arguments["command"], "env": env,
        "timeout_ms": _optional_int(arguments, "timeout_ms"), "user": None,
        "working_directory": directory if isinstance(directory, str) else None}}


def _apply_patch_call(arguments: dict[str, Any]) -> dict[str, Any] | None:
    kind, path, diff = arguments.get("type"), arguments.get("path"), arguments.get("diff")
    if not isinstance(path, str) or not path:
        return None
    if kind == "delete_file":
        return {"type": "apply_patch_call", "operation": {"type": kind, "path": path}}
    if kind in ("create_file", "update_file") and isinstance(diff, str):
        return {"type": "apply_patch_call", "operation": {"type": kind, "path": path, "diff": diff}}
    return None


# A client-run built-in tool's name -> its call item's id prefix and the call item its
# arguments make (None for arguments that do not make one).
_CLIENT_CALLS: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any] | None]]] = {
    "shell": ("shc", _shell_call), "local_shell": ("lsc", _local_shell_call), "apply_patch": ("apc", _apply_patch_call),
}


class ClientToolCallItem(OutputItem):
    """A call of a built-in tool the client runs (``CLIENT_TOOLS`` in
    ``services/dialects/tools.py``), reported whole as the SDK's call item once its
    arguments are complete. Arguments that do not make one (cut short, or not as the
    tool declares them) are reported as a function call of that name, as written, so
    that the client sees what the model said."""

    def __init__(self, response_id: str, output_index: int, name: str) -> None:
        self.prefix, self._build = _CLIENT_CALLS[name]
        super().__init__(response_id, output_index)
        self._name = name
        self._response_id = response_id
        self.call_id = derived_id("call", response_id, output_index)

    def open(self, emit: Emit) -> None:
        pass

    def close(self, emit: Emit, status: str) -> None:
        try:
            arguments = orjson.loads(self.full_text)
        except orjson.JSONDecodeError:
            arguments = None
        built = self._build(arguments) if isinstance(arguments, dict) and status == "completed" else None
        if built is None:
            self.id = derived_id("fc", self._response_id, self.output_index)
            built = {"type": "function_call", "name": self._name, "arguments": self.full_text}
        self.item = {"id": self.id, **built, "call_id": self.call_id, "status": "in_progress"}
        super().open(emit)
        self.item["status"] = status
        super().close(emit, status)


def classify(
    response_id: str, output_index: int, channel: str | None, recipient: str | None, context: ParseContext,
    seal_reasoning: ReasoningSealer | None = None,
) -> OutputItem:
    """Which output item a message becomes."""
    if recipient:
        name = recipient.removeprefix("functions.")
        if recipient.startswith("functions.") or name in context.function_tools:
            if name == TOOL_SEARCH and context.tool_search:
                return ToolSearchCallItem(response_id, output_index)
            if name in context.client_tools:
                return ClientToolCallItem(response_id, output_index, name)
            if name in context.custom_tools:
                return CustomToolCallItem(response_id, output_index, name, context)
            return FunctionCallItem(response_id, output_index, name, context)
        if recipient.startswith("browser.") and recipient.removeprefix("browser.") in WEB_SEARCH_COMMANDS:
            return WebSearchCallItem(response_id, output_index, recipient.removeprefix("browser."))
        if recipient == "python":
            return CodeInterpreterCallItem(response_id, output_index)
        if recipient not in ("assistant", "user", "all"):
            return McpCallItem(response_id, output_index, recipient)
    if channel == "analysis":
        return ReasoningItem(response_id, output_index, seal_reasoning)
    # Preambles (commentary without a recipient) are user-visible text, as is text on
    # a channel the model made up.
    phase = "commentary" if channel == "commentary" else "final_answer"
    return MessageItem(response_id, output_index, phase, context.include_logprobs,
                       context.v >= LOG_FORMAT_PART_LOGPROBS)
