"""The tools a request offers, as every dialect offers them to the model (pure).

Function and custom tools are offered under qualified names: a top-level tool by its
name, a namespaced one as ``namespace.name`` (a namespace named ``functions`` holds
top-level tools). A custom (freeform) tool is offered as a function of one string
parameter, ``input``; the parser unwraps it. A client-executed ``tool_search`` is
offered as a function too, as are the built-in tools a client runs (shell, local_shell,
apply_patch), whose calls the parser reports as the SDK's call items. Built-in tools
that run on the server (web search, code interpreter, file search, ...) are accepted
but not offered: this server does not run them, and a call that nobody runs must not end
a response. ``tool_choice`` narrows what is offered and may add an instruction."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from steno.schemas.responses import LOG_FORMAT, ParseContext
from steno.services.dialects.base import Grammar, InvalidInput

# The single string parameter a custom (freeform) tool is offered with.
CUSTOM_TOOL_INPUT_ARG = "input"
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The function a client-executed tool search is offered as.
TOOL_SEARCH = "tool_search"
TOOL_SEARCH_PARAMETERS = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "What the tools you need should do."}},
    "required": ["query"],
}
TOOL_SEARCH_DESCRIPTION = "Searches for tools to load for this task; the tools it finds become available to call."
# The namespace whose tools are the top-level ones (a name Harmony gives them too).
TOP_LEVEL_NAMESPACE = "functions"
# Tools of the SDK that run on the server: accepted, not offered (see the docstring).
SERVER_TOOLS = frozenset({
    "web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11", "code_interpreter",
    "file_search", "image_generation", "mcp", "computer", "computer_use_preview", "programmatic_tool_calling",
})
_COMMAND_LIMITS = {
    "timeout_ms": {"type": "integer", "description": "Stop the command after this many milliseconds."},
}
# Built-in tools the client runs (the SDK's shell, local_shell and apply_patch): offered as
# functions of their own names, their calls reported as the SDK's call items (shell_call,
# local_shell_call, apply_patch_call). A shell in a hosted container runs on the server:
# accepted, not offered.
CLIENT_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "shell": ("Runs shell commands on the user's machine, one after another, and returns what each printed.", {
        "type": "object",
        "properties": {
            "commands": {"type": "array", "items": {"type": "string"}, "description": "The commands, in order."},
            **_COMMAND_LIMITS,
            "max_output_length": {"type": "integer", "description": "Keep at most this many characters of output."},
        },
        "required": ["commands"],
    }),
    "local_shell": ("Runs one command on the user's machine and returns what it printed.", {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}, "description": "The program and its arguments."},
            "working_directory": {"type": "string"},
            **_COMMAND_LIMITS,
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["command"],
    }),
    "apply_patch": ("Creates, updates or deletes one file on the user's machine. For create_file, diff is the "
                    "new file's lines, each starting with '+'; for update_file, a diff of '@@' context lines and "
                    "lines starting with ' ', '-' or '+'; delete_file takes no diff.", {
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["create_file", "update_file", "delete_file"]},
            "path": {"type": "string", "description": "The file, relative to the working directory."},
            "diff": {"type": "string"},
        },
        "required": ["type", "path"],
    }),
}


@dataclass(frozen=True)
class FunctionTool:
    qualified_name: str
    description: str
    parameters: dict[str, Any] | None


@dataclass
class ToolCatalog:
    """The tools a request offers, as the model will see them."""

    functions: dict[str, FunctionTool] = field(default_factory=dict)  # qualified name -> tool
    custom: set[str] = field(default_factory=set)
    namespaces: set[str] = field(default_factory=set)
    tool_search: bool = False
    # The client-run built-in tools offered (CLIENT_TOOLS), by name.
    client_tools: set[str] = field(default_factory=set)
    # Bare name -> the qualified names of the namespaced tools that have it.
    namespaced_by_bare: dict[str, list[str]] = field(default_factory=dict)

    def qualified(self, name: str, namespace: str | None) -> str:
        """The qualified name a client means by ``name`` (in ``namespace``, if given). A
        top-level tool wins its bare name; a bare name that only one namespaced tool has
        means that tool; an ambiguous one is kept as received."""
        if namespace and namespace != TOP_LEVEL_NAMESPACE:
            return f"{namespace}.{name}"
        if name in self.functions:
            return name
        namespaced = self.namespaced_by_bare.get(name, [])
        return namespaced[0] if len(namespaced) == 1 else name

    def parse_context(self, dialect: str, prompt_tokens: int) -> ParseContext:
        """What the parser must know of these tools to tell calls apart."""
        return ParseContext(
            v=LOG_FORMAT,
            prompt_tokens=prompt_tokens,
            function_tools=sorted(self.functions),
            custom_tools=sorted(self.custom),
            namespaces=sorted(self.namespaces),
            tool_search=self.tool_search,
            client_tools=sorted(self.client_tools),
            dialect=dialect,
        )

    def narrowed(self) -> ToolCatalog:
        """An empty catalog that resolves names as this one does."""
        return ToolCatalog(namespaces=self.namespaces, namespaced_by_bare=self.namespaced_by_bare)

    def offer(self, qualified_name: str, source: ToolCatalog) -> None:
        self.functions[qualified_name] = source.functions[qualified_name]
        if qualified_name in source.custom:
            self.custom.add(qualified_name)
        if qualified_name == TOOL_SEARCH:
            self.tool_search = source.tool_search
        if qualified_name in source.client_tools:
            self.client_tools.add(qualified_name)

    def declare(self, tool: FunctionTool, param: str, custom: bool = False) -> None:
        """Adds a tool; one declared again must be declared the same."""
        known = self.functions.get(tool.qualified_name)
        if known is not None:
            if known != tool or custom != (tool.qualified_name in self.custom):
                raise InvalidInput(f"tool {tool.qualified_name!r} is declared twice, differently", f"{param}.name")
            return
        self.functions[tool.qualified_name] = tool
        if custom:
            self.custom.add(tool.qualified_name)


_CUSTOM_INPUT = {
    "type": "object",
    "properties": {CUSTOM_TOOL_INPUT_ARG: {
        "type": "string", "description": "The complete freeform input for this tool, passed through verbatim."}},
    "required": [CUSTOM_TOOL_INPUT_ARG],
}
# How a custom tool's grammar is told in its description, where it keeps its lines.
_GRAMMAR_INTRO = "Its input must match this {syntax} grammar:\n"
_GRAMMAR_SAID = re.compile(r"(?:^|\n\n)Its input must match this (\w+) grammar:\n(.*)\Z", re.S)


def _custom_description(tool: dict[str, Any], param: str) -> str:
    description = _description(tool, param)
    fmt = tool.get("format") or {}
    if not isinstance(fmt, dict):
        raise InvalidInput("a custom tool's format must be an object", f"{param}.format")
    if fmt.get("type") != "grammar":
        return description
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    if syntax not in ("lark", "regex") or not isinstance(definition, str) or not definition:
        raise InvalidInput("a grammar format needs a syntax ('lark' or 'regex') and a definition", f"{param}.format")
    said = _GRAMMAR_INTRO.format(syntax=syntax) + definition
    return f"{description}\n\n{said}" if description else said


def grammar_in(description: str) -> Grammar | None:
    """The grammar a custom tool's description (as offered) tells, if any."""
    said = _GRAMMAR_SAID.search(description)
    return Grammar(said.group(1), said.group(2)) if said else None


def _description(tool: dict[str, Any], param: str) -> str:
    description = tool.get("description") or ""
    if not isinstance(description, str):
        raise InvalidInput("a tool's description must be a string", f"{param}.description")
    return description


def _add_callable(catalog: ToolCatalog, tool: dict[str, Any], param: str, namespace: str | None) -> None:
    kind = tool.get("type")
    name = tool.get("name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise InvalidInput("a tool name must be 1-64 letters, digits, '_' or '-'", f"{param}.name")
    qualified = f"{namespace}.{name}" if namespace else name
    if kind == "function":
        description = _description(tool, param)
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidInput("function parameters must be a JSON schema object", f"{param}.parameters")
        catalog.declare(FunctionTool(qualified, description, parameters), param)
    elif kind == "custom":
        catalog.declare(FunctionTool(qualified, _custom_description(tool, param), _CUSTOM_INPUT), param, custom=True)
    else:
        raise InvalidInput(f"unsupported tool type {kind!r}", f"{param}.type")
    if namespace and qualified not in catalog.namespaced_by_bare.setdefault(name, []):
        catalog.namespaced_by_bare[name].append(qualified)


def _add_tool_search(catalog: ToolCatalog, tool: dict[str, Any], param: str) -> None:
    parameters = tool.get("parameters") or TOOL_SEARCH_PARAMETERS
    if not isinstance(parameters, dict):
        raise InvalidInput("tool_search parameters must be a JSON schema object", f"{param}.parameters")
    catalog.declare(FunctionTool(TOOL_SEARCH, _description(tool, param) or TOOL_SEARCH_DESCRIPTION, parameters), param)
    catalog.tool_search = True


def answered_call_id(output_item: dict[str, Any]) -> Any:
    """The call id a tool output item answers (a local_shell output names it ``id``)."""
    return output_item.get("id" if output_item.get("type") == "local_shell_call_output" else "call_id")


def _runs_on_client(tool: dict[str, Any]) -> bool:
    environment = tool.get("environment")
    return not isinstance(environment, dict) or environment.get("type") in (None, "local")


def tool_catalog(tools: Iterable[tuple[str, dict[str, Any]]]) -> ToolCatalog:
    """The catalog of ``tools``: (param naming where each was declared, tool)."""
    catalog = ToolCatalog()
    for param, tool in tools:
        if not isinstance(tool, dict):
            raise InvalidInput("a tool must be an object", param)
        kind = tool.get("type")
        if kind in ("function", "custom"):
            _add_callable(catalog, tool, param, None)
        elif kind == "namespace":
            namespace = tool.get("name")
            if not isinstance(namespace, str) or not TOOL_NAME.match(namespace):
                raise InvalidInput("a namespace needs a name of letters, digits, '_' or '-'", f"{param}.name")
            inner = tool.get("tools")
            if not isinstance(inner, list) or not inner:
                raise InvalidInput("a namespace needs a non-empty list of tools", f"{param}.tools")
            top_level = namespace == TOP_LEVEL_NAMESPACE
            if not top_level:
                catalog.namespaces.add(namespace)
            for inner_index, inner_tool in enumerate(inner):
                if not isinstance(inner_tool, dict):
                    raise InvalidInput("a tool must be an object", f"{param}.tools[{inner_index}]")
                _add_callable(catalog, inner_tool, f"{param}.tools[{inner_index}]", None if top_level else namespace)
        elif kind == "tool_search" and tool.get("execution", "server") == "client":
            _add_tool_search(catalog, tool, param)
        elif kind in CLIENT_TOOLS:
            if _runs_on_client(tool):
                description, parameters = CLIENT_TOOLS[kind]
                catalog.declare(FunctionTool(kind, description, parameters), param)
                catalog.client_tools.add(kind)
        elif kind not in SERVER_TOOLS and kind != "tool_search":
            raise InvalidInput(f"unsupported tool type {kind!r}", f"{param}.type")
    return catalog


def _named(catalog: ToolCatalog, choice: dict[str, Any], param: str) -> str:
    name = catalog.qualified(str(choice.get("name")), choice.get("namespace"))
    if name in catalog.functions:
        return name
    candidates = catalog.namespaced_by_bare.get(name, [])
    if len(candidates) > 1:
        raise InvalidInput(f"{name!r} names several tools ({', '.join(candidates)}); give its namespace", param)
    raise InvalidInput(f"{name!r} is not among the tools", param)


def apply_tool_choice(catalog: ToolCatalog, choice: str | dict[str, Any]) -> tuple[ToolCatalog, str | None]:
    """The tools actually offered, and an instruction saying what ``tool_choice`` asks."""
    if choice == "auto":
        return catalog, None
    if choice == "none":
        return ToolCatalog(), None
    if choice == "required":
        if not catalog.functions:
            raise InvalidInput("tool_choice 'required' needs at least one tool this server can offer "
                               "(built-in tools are not run here)", "tool_choice")
        return catalog, "You must call one of the available tools before you answer."
    if not isinstance(choice, dict):
        raise InvalidInput(f"unsupported tool_choice {choice!r}", "tool_choice")
    kind = choice.get("type")
    if kind in ("function", "custom"):
        name = _named(catalog, choice, "tool_choice.name")
        only = catalog.narrowed()
        only.offer(name, catalog)
        return only, f"You must call the tool `{name}`."
    if kind == "allowed_tools":
        allowed = catalog.narrowed()
        listed = choice.get("tools") or []
        if not isinstance(listed, list):
            raise InvalidInput("allowed_tools needs a list of tools", "tool_choice.tools")
        for index, tool in enumerate(listed):
            if not isinstance(tool, dict):
                raise InvalidInput("an allowed tool must be an object", f"tool_choice.tools[{index}]")
            if tool.get("type") == "tool_search" and catalog.tool_search:
                allowed.offer(TOOL_SEARCH, catalog)
            elif tool.get("type") in catalog.client_tools:
                allowed.offer(tool["type"], catalog)
            elif tool.get("type") not in SERVER_TOOLS and tool.get("type") not in CLIENT_TOOLS:
                # (built-in tools not offered are not offered here either)
                allowed.offer(_named(catalog, tool, f"tool_choice.tools[{index}]"), catalog)
        return apply_tool_choice(allowed, "required" if choice.get("mode") == "required" else "auto")
    if kind == "tool_search" and catalog.tool_search:
        only = catalog.narrowed()
        only.offer(TOOL_SEARCH, catalog)
        return only, f"You must call the tool `{TOOL_SEARCH}`."
    if kind in catalog.client_tools:
        only = catalog.narrowed()
        only.offer(kind, catalog)
        return only, f"You must call the tool `{kind}`."
    if kind in SERVER_TOOLS or kind in CLIENT_TOOLS:
        raise InvalidInput(f"tool_choice asks for the built-in tool {kind!r}, which this server does not run",
                           "tool_choice.type")
    raise InvalidInput(f"unsupported tool_choice type {kind!r}", "tool_choice.type")
