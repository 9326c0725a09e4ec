"""What the simulator needs of a chat-template family: the facts of a rendered prompt,
read back from its text, and a completion written as the family's models write one
(pure). It reads the templates shipped with Steno (``templates/``), whose markup it
knows: the user's turns, the tool results and the tools' JSON declarations."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from steno.services.dialects.base import CompletionMessage, OfferedTool, PromptFacts
from steno.services.dialects.chat_template.tool_calls import write_tool_calls
from steno.services.dialects.tools import grammar_in


def _deepseek(name: str) -> str:
    """A DeepSeek marker as a pattern: its bars are full-width and its spaces U+2581."""
    return re.escape(f"<\uff5c{name.replace('_', chr(0x2581))}\uff5c>")


_CHATML_USER = r"<\|im_start\|>user\n(?!<tool_response>)(.*?)<\|im_end\|>"
_CHATML_TOOL = r"<tool_response>\n?(.*?)\n?</tool_response>"
# Family -> (a user turn's text, a tool result's text), each the first group.
_TURNS: dict[str, tuple[str, str]] = {
    "qwen3": (_CHATML_USER, _CHATML_TOOL),
    "hermes": (_CHATML_USER, _CHATML_TOOL),
    "llama3": (r"<\|start_header_id\|>user<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>",
               r"<\|start_header_id\|>(?:ipython|tool)<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>"),
    # Mistral's template writes a result's text unquoted inside its JSON-like wrapper.
    "mistral": (r"\[INST\](.*?)\[/INST\]",
                r'\[TOOL_RESULTS\]\s*\{"content": (.*?), "call_id": "[^"]*"\}\[/TOOL_RESULTS\]'),
    "deepseek": (rf"{_deepseek('User')}(.*?)(?={_deepseek('Assistant')}|{_deepseek('User')}|$)",
                 rf"{_deepseek('tool_output_begin')}(.*?){_deepseek('tool_output_end')}"),
}
# Mistral's template opens every last user turn with this prompt of its own (with tools
# or without), then the system message, each followed by a blank line.
_MISTRAL_TOOL_PROMPT = "You are a helpful assistant that can call tools."
# Keys under which templates wrap a tool result's text.
_RESULT_KEYS = ("content", "output", "result")


def _json_objects(text: str) -> Iterator[tuple[Any, int]]:
    """Every JSON value written in ``text`` from a ``{``, with where it ends. Not strict: a
    template may write a description's line breaks into its JSON as they are."""
    decoder = json.JSONDecoder(strict=False)
    at = text.find("{")
    while at != -1:
        try:
            value, end = decoder.raw_decode(text, at)
        except ValueError:
            at = text.find("{", at + 1)
            continue
        yield value, end
        at = text.find("{", end)


def _declared_tools(text: str) -> dict[str, OfferedTool]:
    """Every tool declaration in the prompt: a JSON object in the chat shape
    (``{"type": "function", "function": {...}}``) or a bare ``{"name", "parameters"}``."""
    tools: dict[str, OfferedTool] = {}
    for value, _ in _json_objects(text):
        if isinstance(value, dict):
            function = value.get("function")
            declared: dict[str, Any] = function if isinstance(function, dict) else value
            if isinstance(declared.get("name"), str) and isinstance(declared.get("parameters"), dict):
                tools[declared["name"]] = OfferedTool(declared["parameters"],
                                                      grammar_in(str(declared.get("description") or "")))
    return tools


def _result_text(text: str) -> str:
    text = text.strip()
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, dict):
        for key in _RESULT_KEYS:
            if isinstance(value.get(key), str):
                return str(value[key])
    return text


def _user_text(text: str) -> str:
    """A user turn's own text: a template that puts the tools into it (Llama 3's) says it
    after them."""
    last_end = max((end for _, end in _json_objects(text)), default=0)
    return text[last_end:].strip()


def read_prompt(family: str, text: str, reasoning_tags: tuple[str, str] | None) -> PromptFacts:
    user_pattern, tool_pattern = _TURNS[family]
    users = [(m.start(), m.group(1)) for m in re.finditer(user_pattern, text, re.S)]
    results = [(m.start(), m.group(1)) for m in re.finditer(tool_pattern, text, re.S)]
    last_user = users[-1] if users else (-1, "")
    if family == "mistral" and last_user[1].lstrip().startswith(_MISTRAL_TOOL_PROMPT):
        last_user = (last_user[0], last_user[1].split("\n\n", 1)[-1])
    last_result = results[-1] if results else None
    tool_result = _result_text(last_result[1]) if last_result is not None and last_result[0] > last_user[0] else None
    # A template that turns thinking off writes the closed, empty block itself.
    reasoning = reasoning_tags is not None and not text.rstrip().endswith(reasoning_tags[1])
    return PromptFacts(user_text=_user_text(last_user[1]), functions=_declared_tools(text), tool_result=tool_result,
                       reasoning=reasoning)


def write_completion(messages: Sequence[CompletionMessage], reasoning_tags: tuple[str, str] | None,
                     tool_call_format: str, end_of_turn: str) -> str:
    """The text of a completion: the reasoning block, the answer, then the calls, and the
    token that ends the turn."""
    parts: list[str] = []
    calls: list[tuple[str, dict[str, Any]]] = []
    for message in messages:
        if message.recipient is not None:
            arguments = json.loads(message.text) if message.text else {}
            calls.append((message.recipient.removeprefix("functions."), arguments))
        elif message.channel == "analysis":
            if reasoning_tags is not None:
                parts.append(f"{reasoning_tags[0]}\n{message.text}\n{reasoning_tags[1]}\n\n")
        else:
            parts.append(message.text)
    if calls:
        parts.append(write_tool_calls(tool_call_format, calls))
    return "".join(parts) + end_of_turn
