"""The simulator engine: well-formed completions in the model's dialect, no model
behind them.

It reads the prompt it is given (through the dialect) and answers deterministically:
- after a tool result, a final answer that quotes the result;
- when the prompt offers function tools, a call to one of them (chosen from the user's
  text) with arguments filled in from the tool's declared parameters;
- otherwise a reasoning message and a final answer echoing the user.
It streams at a configurable first-token delay and token rate. Its text says it is a
simulation; it is for running the pipeline where there is no GPU, and for load."""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import orjson

from steno.schemas.bus import FinishReason, SamplingParams
from steno.services.dialects import CompletionMessage, Dialect, PromptFacts
from steno.services.worker.engine import EngineError, EngineOutput


@dataclass(frozen=True)
class SimulatorTiming:
    first_token_delay_s: float = 0.0
    # 0 means as fast as the event loop allows.
    tokens_per_s: float = 0.0
    # Tokens per output when running flat out.
    chunk_tokens: int = 16


_ARGUMENTS = {"string": lambda text: text, "number": len, "boolean": lambda text: True}


def completion_messages(facts: PromptFacts) -> list[CompletionMessage]:
    """What the simulator says to a prompt."""
    quoted = " ".join(facts.user_text.split())[:400] or "(empty input)"
    if facts.tool_result is not None:
        result = " ".join(facts.tool_result.split())[:400]
        return [
            CompletionMessage("analysis", "Simulated reasoning: the tool answered; I will report it."),
            CompletionMessage("final", f"Steno simulator reply: the tool returned {result}"),
        ]
    reasoning = f"Simulated reasoning: the user wrote {len(facts.user_text)} characters."
    pick = zlib.crc32(facts.user_text.encode())
    if facts.functions:
        name = sorted(facts.functions)[pick % len(facts.functions)]
        arguments = {param: _ARGUMENTS[kind](facts.user_text) if kind in _ARGUMENTS else None
                     for param, kind in facts.functions[name].items()}
        return [CompletionMessage("analysis", reasoning + f" I will call {name}."),
                CompletionMessage("commentary", orjson.dumps(arguments).decode(), f"functions.{name}", "json")]
    return [
        CompletionMessage("analysis", reasoning + " I will echo them back."),
        CompletionMessage("final", f"Steno simulator reply: {quoted}"),
    ]


def completion_tokens(dialect: Dialect, prompt_token_ids: Sequence[int]) -> list[int]:
    """The full simulated completion for a prompt."""
    return dialect.write_completion(completion_messages(dialect.read_prompt(prompt_token_ids)))


# gpt-oss's context, which the simulator stands in for.
DEFAULT_CONTEXT_TOKENS = 131_072


class SimulatorEngine:
    name = "simulator"

    def __init__(self, dialect: Dialect, timing: SimulatorTiming = SimulatorTiming(),
                 context_tokens: int = DEFAULT_CONTEXT_TOKENS) -> None:
        self._dialect = dialect
        self._timing = timing
        self.context_tokens = context_tokens
        self._aborted: set[str] = set()
        # Rendering a completion costs about as much CPU as the whole pipeline spends on a
        # request; a GPU engine spends none of these cores on it, so repeated prompts reuse it.
        self._completion = lru_cache(maxsize=1024)(self._render_completion)

    def _render_completion(self, prompt_token_ids: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(completion_tokens(self._dialect, prompt_token_ids))

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
        finish: FinishReason = "stop"
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

    async def wait_until_dead(self) -> BaseException:
        """The simulator lives in the worker's own process: it cannot die apart from it."""
        never: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        return await never

    async def close(self) -> None:
        self._aborted.clear()
