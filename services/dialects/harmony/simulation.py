"""What the simulator needs of Harmony: the facts of a rendered prompt, read back from
its text, and a completion written as gpt-oss writes one (pure)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import orjson
from openai_harmony import HarmonyEncoding, Message, Role

from steno.services.dialects.base import CompletionMessage, OfferedTool, PromptFacts
from steno.services.dialects.tools import grammar_in

START, END, MESSAGE, RETURN, CALL = "<|start|>", "<|end|>", "<|message|>", "<|return|>", "<|call|>"
# A function as Harmony declares it: its description's comment lines, its name, and the
# TypeScript type of its one argument (up to the line that closes the declaration).
_DECLARATION = re.compile(r"((?:^//[^\n]*\n)*)^type ([\w.-]+) = \((?:_: )?(.*?)\) => any;$", re.S | re.M)
_TYPE_TOKEN = re.compile(r'\s*(//[^\n]*|"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?|[\w$]+|\[\]|\S)')
_NAMED_TYPES = {"string": "string", "number": "number", "boolean": "boolean", "null": "null"}


def _messages(text: str) -> list[tuple[str, str]]:
    """(header, body) of every rendered message."""
    out = []
    for chunk in text.split(START)[1:]:
        header, _, body = chunk.partition(MESSAGE)
        out.append((header, body.split(END, 1)[0].split(CALL, 1)[0]))
    return out


class _TypeReader:
    """Reads the TypeScript Harmony writes for a JSON schema back into one (the part a
    schema's TypeScript keeps: types, required fields, literals)."""

    def __init__(self, text: str) -> None:
        self._tokens = [token for token in _TYPE_TOKEN.findall(text) if not token.startswith("//")]
        self._at = 0

    def _peek(self) -> str:
        return self._tokens[self._at] if self._at < len(self._tokens) else ""

    def _take(self, expected: str | None = None) -> str:
        token = self._peek()
        if expected is not None and token != expected:
            raise ValueError(f"expected {expected!r}, found {token!r}")
        self._at += 1
        return token

    def schema(self) -> dict[str, Any]:
        options = [self._primary()]
        while self._peek() == "|":
            self._take()
            options.append(self._primary())
        if len(options) == 1:
            return options[0]
        if all("enum" in option for option in options):
            return {"enum": [value for option in options for value in option["enum"]]}
        return {"anyOf": options}

    def _primary(self) -> dict[str, Any]:
        token = self._take()
        schema: dict[str, Any]
        if token == "{":
            schema = self._object()
        elif token.startswith('"') or token[:1].isdigit() or token.startswith("-"):
            schema = {"enum": [orjson.loads(token)]}
        elif token in _NAMED_TYPES:
            schema = {"type": _NAMED_TYPES[token]}
        elif token == "any":
            schema = {}
        else:
            raise ValueError(f"unknown type {token!r}")
        while self._peek() == "[]":
            self._take()
            schema = {"type": "array", "items": schema}
        return schema

    def _object(self) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        required = []
        while self._peek() != "}":
            name = self._take()
            optional = self._peek() == "?"
            if optional:
                self._take()
            self._take(":")
            properties[name] = self.schema()
            if not optional:
                required.append(name)
            if self._peek() == ",":
                self._take()
        self._take("}")
        return {"type": "object", "properties": properties, "required": required}

    def done(self) -> bool:
        return self._at == len(self._tokens)


def _parameters(typescript: str) -> dict[str, Any]:
    """The arguments' schema; what cannot be read is any value (``{}``), as for a model."""
    if not typescript.strip():
        return {"type": "object", "properties": {}, "required": []}
    reader = _TypeReader(typescript)
    try:
        schema = reader.schema()
    except (ValueError, IndexError, orjson.JSONDecodeError):
        return {}
    return schema if reader.done() else {}


def read_prompt(encoding: HarmonyEncoding, prompt_token_ids: Sequence[int]) -> PromptFacts:
    # The prompt ends with the header of the turn to generate: not a message.
    messages = _messages(encoding.decode(list(prompt_token_ids)))[:-1]
    user_text = next((body for header, body in reversed(messages) if header == "user"), "")
    functions: dict[str, OfferedTool] = {}
    for header, body in messages:
        if header == "developer" and "namespace functions {" in body:
            declared = body.split("namespace functions {", 1)[1].split("} // namespace functions", 1)[0]
            for comments, name, typescript in _DECLARATION.findall(declared):
                description = "\n".join(line[3:] for line in comments.splitlines())
                functions[name] = OfferedTool(_parameters(typescript), grammar_in(description))
    last_header = messages[-1][0] if messages else ""
    tool_result = messages[-1][1] if " to=assistant" in last_header else None
    return PromptFacts(user_text, functions, tool_result)


def write_completion(encoding: HarmonyEncoding, messages: Sequence[CompletionMessage]) -> list[int]:
    """The tokens after the prompt's ``<|start|>assistant``; the last message ends the
    turn with ``<|call|>`` when it calls a tool, else ``<|return|>``."""
    tokens: list[int] = []
    for message in messages:
        rendered = Message.from_role_and_content(Role.ASSISTANT, message.text).with_channel(message.channel)
        if message.recipient:
            rendered = rendered.with_recipient(message.recipient)
        if message.content_type:
            rendered = rendered.with_content_type(message.content_type)
        tokens += encoding.render(rendered)
    prefix = encoding.encode(START + "assistant", allowed_special="all")
    assert tokens[: len(prefix)] == prefix
    tokens = tokens[len(prefix):]
    end = CALL if messages and messages[-1].recipient else RETURN
    tokens[-1] = encoding.encode(end, allowed_special="all")[0]
    return tokens
