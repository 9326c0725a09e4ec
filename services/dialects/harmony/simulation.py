"""What the simulator needs of Harmony: the facts of a rendered prompt, read back from
its text, and a completion written as gpt-oss writes one (pure)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from openai_harmony import HarmonyEncoding, Message, Role

from steno.services.dialects.base import CompletionMessage, PromptFacts

START, END, MESSAGE, RETURN, CALL = "<|start|>", "<|end|>", "<|message|>", "<|return|>", "<|call|>"
_TOOL_DECLARATION = re.compile(r"^type ([\w.-]+) = \((?:_: \{\n(.*?)\n\})?\) => any;", re.S | re.M)
_PARAMETER = re.compile(r"^([\w-]+)(\?)?: ([^,/\n]+)", re.M)


def _messages(text: str) -> list[tuple[str, str]]:
    """(header, body) of every rendered message."""
    out = []
    for chunk in text.split(START)[1:]:
        header, _, body = chunk.partition(MESSAGE)
        out.append((header, body.split(END, 1)[0].split(CALL, 1)[0]))
    return out


def _json_type(declared: str) -> str:
    """The JSON type of a parameter as Harmony declares it (TypeScript)."""
    if declared.startswith("string") or declared.startswith('"'):
        return "string"
    if declared.startswith("number"):
        return "number"
    if declared.startswith("boolean"):
        return "boolean"
    return "other"


def read_prompt(encoding: HarmonyEncoding, prompt_token_ids: Sequence[int]) -> PromptFacts:
    # The prompt ends with the header of the turn to generate: not a message.
    messages = _messages(encoding.decode(list(prompt_token_ids)))[:-1]
    user_text = next((body for header, body in reversed(messages) if header == "user"), "")
    functions: dict[str, dict[str, str]] = {}
    for header, body in messages:
        if header == "developer" and "namespace functions {" in body:
            for name, params in _TOOL_DECLARATION.findall(body):
                functions[name] = {
                    param: _json_type(declared.strip())
                    for param, optional, declared in _PARAMETER.findall(params) if not optional
                }
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
