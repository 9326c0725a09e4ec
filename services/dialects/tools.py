"""The tools a request offers, as every dialect offers them to the model (pure).

Function and custom tools are offered under qualified names: a top-level tool by its
name, a namespaced one as ``namespace.name``. A custom (freeform) tool is offered as a
function of one string parameter, ``input``; the parser unwraps it. ``tool_choice``
narrows what is offered and may add an instruction."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from steno.schemas.responses import LOG_FORMAT, ParseContext
from steno.services.dialects.base import InvalidInput

# The single string parameter a custom (freeform) tool is offered with.
CUSTOM_TOOL_INPUT_ARG = "input"
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
WEB_SEARCH_TOOLS = frozenset({"web_search", "web_search_preview", "web_search_2025_08_26",
                              "web_search_preview_2025_03_11"})


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
    browser: bool = False
    python: bool = False
    # Bare name -> the qualified names of the namespaced tools that have it.
    namespaced_by_bare: dict[str, list[str]] = field(default_factory=dict)

    @property
    def any_offered(self) -> bool:
        return bool(self.functions or self.browser or self.python)

    def qualified(self, name: str, namespace: str | None) -> str:
        """The qualified name a client means by ``name`` (in ``namespace``, if given). A
        top-level tool wins its bare name; a bare name that only one namespaced tool has
        means that tool; an ambiguous one is kept as received."""
        if namespace:
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
            dialect=dialect,
        )

    def narrowed(self) -> ToolCatalog:
        """An empty catalog that resolves names as this one does."""
        return ToolCatalog(namespaces=self.namespaces, namespaced_by_bare=self.namespaced_by_bare)

    def offer(self, qualified_name: str, source: ToolCatalog) -> None:
        self.functions[qualified_name] = source.functions[qualified_name]
        if qualified_name in source.custom:
            self.custom.add(qualified_name)


def _custom_parameters(tool: dict[str, Any], param: str) -> dict[str, Any]:
    description = "The complete freeform input for this tool, passed through verbatim."
    fmt = tool.get("format") or {}
    if not isinstance(fmt, dict):
        raise InvalidInput("a custom tool's format must be an object", f"{param}.format")
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
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise InvalidInput("a tool name must be 1-64 letters, digits, '_' or '-'", f"{param}.name")
    qualified = f"{namespace}.{name}" if namespace else name
    if qualified in catalog.functions:
        raise InvalidInput(f"tool {qualified!r} is declared twice", f"{param}.name")
    description = tool.get("description") or ""
    if not isinstance(description, str):
        raise InvalidInput("a tool's description must be a string", f"{param}.description")
    if kind == "function":
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidInput("function parameters must be a JSON schema object", f"{param}.parameters")
        catalog.functions[qualified] = FunctionTool(qualified, description, parameters)
    elif kind == "custom":
        catalog.functions[qualified] = FunctionTool(qualified, description, _custom_parameters(tool, param))
        catalog.custom.add(qualified)
    else:
        raise InvalidInput(f"unsupported tool type {kind!r}", f"{param}.type")
    if namespace:
        catalog.namespaced_by_bare.setdefault(name, []).append(qualified)


def tool_catalog(tools: list[dict[str, Any]]) -> ToolCatalog:
    catalog = ToolCatalog()
    for index, tool in enumerate(tools):
        param = f"tools[{index}]"
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
            catalog.namespaces.add(namespace)
            for inner_index, inner_tool in enumerate(inner):
                if not isinstance(inner_tool, dict):
                    raise InvalidInput("a tool must be an object", f"{param}.tools[{inner_index}]")
                _add_callable(catalog, inner_tool, f"{param}.tools[{inner_index}]", namespace)
        elif kind in WEB_SEARCH_TOOLS:
            catalog.browser = True
        elif kind == "code_interpreter":
            catalog.python = True
        else:
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
        if not catalog.any_offered:
            raise InvalidInput("tool_choice 'required' needs at least one tool", "tool_choice")
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
            tool_kind = tool.get("type") if isinstance(tool, dict) else None
            if tool_kind in WEB_SEARCH_TOOLS:
                allowed.browser = catalog.browser
            elif tool_kind == "code_interpreter":
                allowed.python = catalog.python
            elif isinstance(tool, dict):
                allowed.offer(_named(catalog, tool, f"tool_choice.tools[{index}]"), catalog)
            else:
                raise InvalidInput("an allowed tool must be an object", f"tool_choice.tools[{index}]")
        return apply_tool_choice(allowed, "required" if choice.get("mode") == "required" else "auto")
    if kind in WEB_SEARCH_TOOLS and catalog.browser:
        return catalog, "You must use the browser tool before you answer."
    if kind == "code_interpreter" and catalog.python:
        return catalog, "You must use the python tool before you answer."
    raise InvalidInput(f"unsupported tool_choice type {kind!r}", "tool_choice.type")
