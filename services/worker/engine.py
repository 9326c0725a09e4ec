"""The interface every generation engine implements (vLLM, the simulator)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Protocol, Sequence

from steno.schemas.bus import FinishReason, SamplingParams


@dataclass(frozen=True, slots=True)
class EngineOutput:
    """New tokens since the previous output; ``finish_reason`` is set on the last one."""

    token_ids: list[int]
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: FinishReason | None = None
    cached_tokens: int | None = None


class EngineError(RuntimeError):
    """The engine failed this request; the response fails visibly with this message."""


class EngineDead(EngineError):
    """The engine itself is gone (e.g. vLLM's engine core process died): this request
    failed, and so will every later one. The process should stop taking work and exit
    so that its supervisor restarts it."""


class Engine(Protocol):
    name: str

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        prior_output: Sequence[int] = (),
    ) -> AsyncIterator[EngineOutput]:
        """Streams the output after ``prior_output`` (tokens an earlier attempt already
        published, which the engine continues; ``sampling.max_tokens`` counts only new
        tokens). An engine that cannot continue raises EngineError."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def close(self) -> None: ...
