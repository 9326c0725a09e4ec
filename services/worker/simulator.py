"""The simulator engine: well-formed Harmony completions, no model behind them.

It reads the prompt it is given and answers deterministically from it:
- after a tool result, a final answer that quotes the result;
- when the prompt offers function tools, a call to one of them (chosen from the user's
  text) with arguments filled in from the tool's declared parameters;
- when it offers the browser or python tool, a call to that;
- otherwise an analysis-channel reasoning part and a final answer echoing the user.
It streams at a configurable first-token delay and token rate. Its text says it is a
simulation; it is for running the pipeline where there is no GPU, and for load."""

from __future__ import annotations

import asyncio
import re
import time
import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import AsyncIterator, Sequence

import orjson
from openai_harmony import HarmonyEncoding, Message, Role

from steno.schemas.bus import SamplingParams
from steno.services.worker.engine import EngineError, EngineOutput

START, END, MESSAGE, RETURN, CALL = "<|start|>", "<|end|>", "<|message|>", "<|return|>", "<|call|>"
_TOOL_DECLARATION = re.compile(r"^type ([\w.-]+) = \((?:_: \{\n(.*?)\n\})?\) => any;", re.S | re.M)
_PARAMETER = re.compile(r"^([\w-]+)(\?)?: ([^,/\n]+)", re.M)


@dataclass(frozen=True)
class SimulatorTiming:
    first_token_delay_s: float = 0.0
    # 0 means as fast as the event loop allows.
    tokens_per_s: float = 0.0
    # Tokens per output when running flat out.
    chunk_tokens: int = 16


@dataclass(frozen=True)
class PromptFacts:
    """What the simulator reads off a rendered prompt."""

    user_text: str
    # Qualified function name -> its required parameters and their declared types.
    functions: dict[str, dict[str, str]]
    browser: bool
    python: bool
    # The text of the tool result the prompt ends with, if it ends with one.
    tool_result: str | None


def _messages(text: str) -> list[tuple[str, str]]:
    """(header, body) of every rendered message."""
    out = []
    for chunk in text.split(START)[1:]:
        header, _, body = chunk.partition(MESSAGE)
        out.append((header, body.split(END, 1)[0].split(CALL, 1)[0]))
    return out


def read_prompt(encoding: HarmonyEncoding, prompt_token_ids: list[int]) -> PromptFacts:
    # The prompt ends with the header of the turn to generate: not a message.
    messages = _messages(encoding.decode(prompt_token_ids))[:-1]
    user_text = next((body for header, body in reversed(messages) if header == "user"), "")
    functions: dict[str, dict[str, str]] = {}
    browser = python = False
    for header, body in messages:
        if header == "system":
            browser = "namespace browser {" in body
            python = "## python" in body
        if header == "developer" and "namespace functions {" in body:
            for name, params in _TOOL_DECLARATION.findall(body):
                functions[name] = {p: t.strip() for p, optional, t in _PARAMETER.findall(params) if not optional}
    last_header = messages[-1][0] if messages else ""
    tool_result = messages[-1][1] if " to=assistant" in last_header else None
    return PromptFacts(user_text, functions, browser, python, tool_result)


def _argument(declared_type: str, user_text: str):
    if declared_type.startswith("string") or declared_type.startswith('"'):
        return user_text
    if declared_type.startswith("number"):
        return len(user_text)
    if declared_type.startswith("boolean"):
        return True
    return None


def _render(encoding: HarmonyEncoding, messages: list[Message], end: str) -> list[int]:
    tokens: list[int] = []
    for message in messages:
        tokens += encoding.render(message)
    # The prompt already ends with <|start|>assistant; the last message ends the turn.
    prefix = encoding.encode(START + "assistant", allowed_special="all")
    assert tokens[: len(prefix)] == prefix
    tokens = tokens[len(prefix):]
    tokens[-1] = encoding.encode(end, allowed_special="all")[0]
    return tokens


def _assistant(channel: str, text: str) -> Message:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)


def completion_tokens(encoding: HarmonyEncoding, facts: PromptFacts) -> list[int]:
    """The full simulated completion for a prompt."""
    quoted = " ".join(facts.user_text.split())[:400] or "(empty input)"
    if facts.tool_result is not None:
        result = " ".join(facts.tool_result.split())[:400]
        return _render(encoding, [
            _assistant("analysis", "Simulated reasoning: the tool answered; I will report it."),
            _assistant("final", f"Steno simulator reply: the tool returned {result}"),
        ], RETURN)
    reasoning = f"Simulated reasoning: the user wrote {len(facts.user_text)} characters."
    pick = zlib.crc32(facts.user_text.encode())
    if facts.functions:
        name = sorted(facts.functions)[pick % len(facts.functions)]
        arguments = {param: _argument(kind, facts.user_text) for param, kind in facts.functions[name].items()}
        call = _assistant("commentary", orjson.dumps(arguments).decode()).with_recipient(f"functions.{name}")
        return _render(encoding, [_assistant("analysis", reasoning + f" I will call {name}."),
                                  call.with_content_type("json")], CALL)
    if facts.browser:
        call = _assistant("analysis", orjson.dumps({"query": quoted}).decode()).with_recipient("browser.search")
        return _render(encoding, [_assistant("analysis", reasoning + " I will search."), call], CALL)
    if facts.python:
        call = _assistant("analysis", f"print({quoted!r})").with_recipient("python")
        return _render(encoding, [_assistant("analysis", reasoning + " I will run code."), call], CALL)
    return _render(encoding, [
        _assistant("analysis", reasoning + " I will echo them back."),
        _assistant("final", f"Steno simulator reply: {quoted}"),
    ], RETURN)


class SimulatorEngine:
    name = "simulator"

    def __init__(self, encoding: HarmonyEncoding, timing: SimulatorTiming = SimulatorTiming()) -> None:
        self._encoding = encoding
        self._timing = timing
        self._aborted: set[str] = set()
        # Rendering a completion costs about as much CPU as the whole pipeline spends on a
        # request; a GPU engine spends none of these cores on it, so repeated prompts reuse it.
        self._completion = lru_cache(maxsize=1024)(self._render_completion)

    def _render_completion(self, prompt_token_ids: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(completion_tokens(self._encoding, read_prompt(self._encoding, list(prompt_token_ids))))

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        prior_output: Sequence[int] = (),
    ) -> AsyncIterator[EngineOutput]:
        tokens = list(self._completion(tuple(prompt_token_ids)))
        if list(prior_output) != tokens[: len(prior_output)]:
            raise EngineError("cannot continue: the earlier output is not this simulator's completion")
        tokens = tokens[len(prior_output):]
        finish = "stop"
        if sampling.max_tokens is not None and len(tokens) > sampling.max_tokens:
            tokens, finish = tokens[: sampling.max_tokens], "length"
        timing = self._timing
        step = 1 if timing.tokens_per_s > 0 else max(1, timing.chunk_tokens)
        started = time.monotonic() + timing.first_token_delay_s
        if timing.first_token_delay_s:
            await asyncio.sleep(timing.first_token_delay_s)
        try:
            for offset in range(0, len(tokens), step):
                if request_id in self._aborted:
                    yield EngineOutput([], finish_reason="cancelled")
                    return
                if timing.tokens_per_s > 0:
                    delay = started + offset / timing.tokens_per_s - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                else:
                    await asyncio.sleep(0)
                chunk = tokens[offset: offset + step]
                last = offset + step >= len(tokens)
                yield EngineOutput(chunk, finish_reason=finish if last else None)
            if not tokens:
                yield EngineOutput([], finish_reason=finish)
        finally:
            self._aborted.discard(request_id)

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    async def close(self) -> None:
        self._aborted.clear()
