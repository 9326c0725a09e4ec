"""The interface every generation engine implements (vLLM, the simulator)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

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
    failed, and so will every later one."""


class Engine(Protocol):
    """What the worker relies on. Besides generating, an engine says when it has died
    (``wait_until_dead``), so that the worker stops taking work and exits for its
    supervisor to restart it."""

    name: str

    @property
    def context_tokens(self) -> int:
        """The tokens a prompt and its output may hold together (the model's context)."""
        ...

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        prior_output: Sequence[int] = (),
    ) -> AsyncIterator[EngineOutput]:
        """Streams the output after ``prior_output`` (tokens an earlier attempt already
        published, which the engine continues; ``sampling.max_tokens`` counts only new
        tokens). An engine that cannot continue raises EngineError; one that died under
        the request raises EngineDead, and ``wait_until_dead`` returns."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def wait_until_dead(self) -> BaseException:
        """Returns the cause once the engine can serve nothing more (never, for an
        engine that cannot die)."""
        ...

    async def close(self) -> None: ...
