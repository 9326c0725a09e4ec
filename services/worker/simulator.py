"""The simulator engine: well-formed completions in the model's dialect, no model
behind them.

It reads the prompt it is given (through the dialect) and answers deterministically:
- after a tool result, a final answer that quotes the result;
- when the user's text holds a line ``steno-simulator: call <tool> <arguments>``, a call
  to that tool (by its name or its namespaced name) with those arguments: a JSON object
  for a function, the rest of the text verbatim for a custom tool;
- else, when the prompt offers function tools, a call to one of them (chosen from the
  user's text) with arguments made from the tool's declared parameters (a small instance
  of them, free strings holding the user's text) or, for a custom tool with a grammar,
  a short sentence of the grammar;
- otherwise a reasoning message and a final answer echoing the user.
An answer asked for as JSON (``text.format``) is a small instance of the schema (an
object for ``json_object``). The answer can be padded to a length, for load. It streams
at a configurable first-token delay and token rate, and reports the prompt tokens its
model of a prefix cache had already seen on this worker, as vLLM does. Its text says it is a simulation;
it is for running the pipeline where there is no GPU, and for load."""

from __future__ import annotations

import asyncio
import math
import re
import time
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from steno.schemas.bus import FinishReason, SamplingParams, StructuredOutput
from steno.services.dialects import CompletionMessage, Dialect, OfferedTool, PromptFacts
from steno.services.dialects.tools import CUSTOM_TOOL_INPUT_ARG
from steno.services.worker.engine import EngineError, EngineOutput
from steno.services.worker.instances import lark_example, regex_example, schema_instance
from steno.services.worker.prefix_cache import PrefixCache


@dataclass(frozen=True)
class SimulatorTiming:
    first_token_delay_s: float = 0.0
    # 0 means as fast as the event loop allows. Otherwise, like a batched engine, every
    # running request's tokens come out on one step clock (``StepClock``).
    tokens_per_s: float = 0.0
    # Tokens per output when running flat out.
    chunk_tokens: int = 16


class StepClock:
    """The engine's steps, every ``step_s`` (on the monotonic clock): a request's next
    token waits for the first step at or after its own time, and every request due at
    a step is woken by that step's one timer, together, as a batched engine's step
    yields a token for each running request."""

    def __init__(self, step_s: float) -> None:
        self._step_s = step_s
        self._steps: dict[int, asyncio.Event] = {}

    async def until(self, when: float) -> None:
        step = math.ceil(when / self._step_s)
        delay = step * self._step_s - time.monotonic()
        if delay <= 0:
            return
        reached = self._steps.get(step)
        if reached is None:
            reached = self._steps[step] = asyncio.Event()
            asyncio.get_running_loop().call_later(delay, self._reach, step)
        await reached.wait()

    def _reach(self, step: int) -> None:
        self._steps.pop(step).set()

    def passed(self, when: float) -> bool:
        """Whether the step a token due at ``when`` comes out on has already come."""
        return math.ceil(when / self._step_s) * self._step_s <= time.monotonic()


_DIRECTIVE = re.compile(r"(?:^|\n)steno-simulator: call ([\w.-]+)[ \n]?(.*)\Z", re.S)
# A word the dialects' vocabularies hold as one token, to pad answers with.
_FILLER = " more"


def _quoted(text: str) -> str:
    return " ".join(text.split())[:400]


def _answer(text: str, answer_format: StructuredOutput | None) -> str:
    if answer_format is None:
        return text
    if answer_format.kind == "json_object":
        return orjson.dumps({"reply": text}).decode()
    return orjson.dumps(schema_instance(answer_format.json_schema or {}, text)).decode()


def _arguments(tool: OfferedTool, text: str) -> dict[str, Any]:
    arguments = schema_instance(tool.parameters, text)
    if not isinstance(arguments, dict):
        arguments = {}
    if tool.grammar is not None:
        read = lark_example if tool.grammar.syntax == "lark" else regex_example
        arguments[CUSTOM_TOOL_INPUT_ARG] = read(tool.grammar.definition) or text
    return arguments


def _takes_freeform_input(tool: OfferedTool, directed: str) -> bool:
    """Whether a directive's arguments are a custom tool's input (a prompt shows a custom
    tool as a function of one string, ``input``) rather than a JSON object."""
    if tool.grammar is not None:
        return True
    properties = tool.parameters.get("properties")
    return isinstance(properties, dict) and set(properties) == {CUSTOM_TOOL_INPUT_ARG} \
        and not directed.lstrip().startswith("{")


def _directed_call(facts: PromptFacts, reasoning: str) -> list[CompletionMessage] | None:
    directive = _DIRECTIVE.search(facts.user_text)
    if directive is None:
        return None
    asked, rest = directive.groups()
    name = next((name for name in sorted(facts.functions) if name == asked or name.rsplit(".", 1)[-1] == asked), None)
    if name is None:
        return [CompletionMessage("analysis", reasoning + f" No tool named {asked} is offered."),
                CompletionMessage("final", f"Steno simulator reply: no tool named {asked} is offered.")]
    if _takes_freeform_input(facts.functions[name], rest):
        arguments = orjson.dumps({CUSTOM_TOOL_INPUT_ARG: rest}).decode()
    else:
        arguments = rest.strip() or "{}"
    return [CompletionMessage("analysis", reasoning + f" I was asked to call {name}."),
            CompletionMessage("commentary", arguments, f"functions.{name}", "json")]


def completion_messages(facts: PromptFacts, answer_format: StructuredOutput | None = None) -> list[CompletionMessage]:
    """What the simulator says to a prompt (without its reasoning where the prompt
    leaves none)."""
    said = _said(facts, answer_format)
    return said if facts.reasoning else [message for message in said if message.channel != "analysis"]


def _said(facts: PromptFacts, answer_format: StructuredOutput | None) -> list[CompletionMessage]:
    if facts.tool_result is not None:
        return [
            CompletionMessage("analysis", "Simulated reasoning: the tool answered; I will report it."),
            CompletionMessage("final", _answer(
                f"Steno simulator reply: the tool returned {_quoted(facts.tool_result)}", answer_format)),
        ]
    reasoning = f"Simulated reasoning: the user wrote {len(facts.user_text)} characters."
    directed = _directed_call(facts, reasoning)
    if directed is not None:
        return directed
    if facts.functions:
        name = sorted(facts.functions)[zlib.crc32(facts.user_text.encode()) % len(facts.functions)]
        arguments = _arguments(facts.functions[name], facts.user_text)
        return [CompletionMessage("analysis", reasoning + f" I will call {name}."),
                CompletionMessage("commentary", orjson.dumps(arguments).decode(), f"functions.{name}", "json")]
    quoted = _quoted(facts.user_text) or "(empty input)"
    return [
        CompletionMessage("analysis", reasoning + " I will echo them back."),
        CompletionMessage("final", _answer(f"Steno simulator reply: {quoted}", answer_format)),
    ]


def completion_tokens(
    dialect: Dialect, prompt_token_ids: Sequence[int], answer_format: StructuredOutput | None = None,
    min_tokens: int = 0,
) -> list[int]:
    """The full simulated completion for a prompt; a plain-text answer is padded until
    the completion has ``min_tokens`` tokens."""
    messages = completion_messages(dialect.read_prompt(prompt_token_ids), answer_format)
    tokens = dialect.write_completion(messages)
    last = messages[-1]
    padded = 0
    while len(tokens) < min_tokens and last.channel == "final" and answer_format is None:
        padded += min_tokens - len(tokens)
        tokens = dialect.write_completion([*messages[:-1], CompletionMessage("final", last.text + _FILLER * padded)])
    return tokens


# gpt-oss's context, which the simulator stands in for.
DEFAULT_CONTEXT_TOKENS = 131_072


class SimulatorEngine:
    name = "simulator"

    def __init__(self, dialect: Dialect, timing: SimulatorTiming = SimulatorTiming(),
                 context_tokens: int = DEFAULT_CONTEXT_TOKENS, answer_tokens: int = 0) -> None:
        """``answer_tokens``: plain answers are padded to completions of this many tokens."""
        self._dialect = dialect
        self._timing = timing
        self._steps = StepClock(1 / timing.tokens_per_s) if timing.tokens_per_s > 0 else None
        self._answer_tokens = answer_tokens
        self.context_tokens = context_tokens
        self._aborted: set[str] = set()
        # Rendering a completion costs about as much CPU as the whole pipeline spends on a
        # request; a GPU engine spends none of these cores on it, so repeated prompts reuse it.
        self._completion = lru_cache(maxsize=1024)(self._render_completion)
        self._prefix_cache = PrefixCache()

    def _render_completion(self, prompt_token_ids: tuple[int, ...], answer_format: str | None) -> tuple[int, ...]:
        structured = StructuredOutput.model_validate_json(answer_format) if answer_format else None
        return tuple(completion_tokens(self._dialect, prompt_token_ids, structured, self._answer_tokens))

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        prior_output: Sequence[int] = (),
    ) -> AsyncIterator[EngineOutput]:
        structured = sampling.structured_output
        tokens = list(self._completion(tuple(prompt_token_ids), structured.model_dump_json() if structured else None))
        if list(prior_output) != tokens[: len(prior_output)]:
            raise EngineError("cannot continue: the earlier output is not this simulator's completion")
        tokens = tokens[len(prior_output):]
        cached_tokens = self._prefix_cache.admit(prompt_token_ids)
        finish: FinishReason = "stop"
        if sampling.max_tokens is not None and len(tokens) > sampling.max_tokens:
            tokens, finish = tokens[: sampling.max_tokens], "length"
        timing = self._timing
        step = 1 if timing.tokens_per_s > 0 else max(1, timing.chunk_tokens)
        started = time.monotonic() + timing.first_token_delay_s
        if timing.first_token_delay_s:
            await asyncio.sleep(timing.first_token_delay_s)
        try:
            offset = 0
            while offset < len(tokens):
                if request_id in self._aborted:
                    yield EngineOutput([], finish_reason="cancelled", cached_tokens=cached_tokens)
                    return
                count = step
                if self._steps is not None:
                    await self._steps.until(started + offset / timing.tokens_per_s)
                    # A reader that fell steps behind gets the tokens of every step it
                    # missed in one output, as vLLM's output collector merges them, not
                    # one output per step in a burst.
                    while offset + count < len(tokens) and self._steps.passed(
                            started + (offset + count) / timing.tokens_per_s):
                        count += 1
                else:
                    await asyncio.sleep(0)
                chunk = tokens[offset: offset + count]
                offset += count
                last = offset >= len(tokens)
                yield EngineOutput(chunk, finish_reason=finish if last else None, cached_tokens=cached_tokens)
            if not tokens:
                yield EngineOutput([], finish_reason=finish, cached_tokens=cached_tokens)
        finally:
            self._aborted.discard(request_id)

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    async def wait_until_dead(self) -> BaseException:
        """The simulator lives in the worker's own process: it cannot die apart from it."""
        never: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        return await never

    async def close(self) -> None:
        self._aborted.clear()
