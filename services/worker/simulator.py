"""The simulator engine: well-formed Harmony completions, no model behind them.

It reads the last user message of the prompt and answers with an analysis-channel
reasoning part and a final-channel answer derived from it, at a configurable first-token
delay and token rate. Its text says it is a simulation; it is for running the pipeline
where there is no GPU, and for load generation."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import AsyncIterator

from openai_harmony import HarmonyEncoding, Message, Role

from schemas.bus import SamplingParams
from services.worker.engine import EngineOutput

START, END, MESSAGE, RETURN = "<|start|>", "<|end|>", "<|message|>", "<|return|>"


@dataclass(frozen=True)
class SimulatorTiming:
    first_token_delay_s: float = 0.0
    # 0 means as fast as the event loop allows.
    tokens_per_s: float = 0.0
    # Tokens per output when running flat out.
    chunk_tokens: int = 16


def last_user_text(encoding: HarmonyEncoding, prompt_token_ids: list[int]) -> str:
    text = encoding.decode(prompt_token_ids)
    marker = START + "user" + MESSAGE
    start = text.rfind(marker)
    if start < 0:
        return ""
    body = text[start + len(marker):]
    return body.split(END, 1)[0]


def completion_tokens(encoding: HarmonyEncoding, user_text: str) -> list[int]:
    """The full simulated completion: reasoning, then the answer, then ``<|return|>``."""
    quoted = " ".join(user_text.split())[:400] or "(empty input)"
    reasoning = f"Simulated reasoning: the user wrote {len(user_text)} characters. I will echo them back."
    answer = f"Steno simulator reply: {quoted}"
    tokens: list[int] = []
    for channel, text in (("analysis", reasoning), ("final", answer)):
        tokens += encoding.render(Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel))
    # The prompt already ends with <|start|>assistant; the last message ends the turn.
    prefix = encoding.encode(START + "assistant", allowed_special="all")
    assert tokens[: len(prefix)] == prefix
    tokens = tokens[len(prefix):]
    tokens[-1] = encoding.encode(RETURN, allowed_special="all")[0]
    return tokens


class SimulatorEngine:
    name = "simulator"

    def __init__(self, encoding: HarmonyEncoding, timing: SimulatorTiming = SimulatorTiming()) -> None:
        self._encoding = encoding
        self._timing = timing
        self._aborted: set[str] = set()

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        tokens = completion_tokens(self._encoding, last_user_text(self._encoding, prompt_token_ids))
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
