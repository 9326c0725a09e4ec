"""The vLLM engine: vLLM's ``AsyncLLM`` (v1 engine), token ids in and token ids out.

The worker never needs text. The prompt goes in as ``TokensPrompt`` and outputs come
back as per-step deltas (``RequestOutputKind.DELTA``, ``detokenize=False``). A tokenizer
is loaded only because structured outputs build their token masks from it; without one
(no ``--tokenizer`` and none beside the weights) the engine runs with
``skip_tokenizer_init`` and refuses structured-output requests, per request.

Structured outputs: a ``text.format`` becomes the grammar the model's dialect builds for
a constrained answer (``Dialect.answer_grammar``; for Harmony, free reasoning first and
the JSON in the final message), scoped by ``--structured-output-scope``.

Failures: anything vLLM raises for one request becomes ``EngineError`` (the response
fails visibly); the engine core dying becomes ``EngineDead`` and ``wait_until_dead``
returns, so the process can stop taking work and exit.

vLLM is imported only here, and this module only when ``--engine vllm`` is chosen. Its
engine core runs in a subprocess: a program that starts this engine needs the usual
``if __name__ == "__main__"`` guard (``services/cli.py`` has one)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steno.schemas.bus import ChatTemplateFiles, FinishReason, SamplingParams, StructuredOutput
from steno.services.dialects import (
    DEFAULT_DIALECT,
    Dialect,
    StructuredOutputScope,
    chat_template_dialect,
    dialect_named,
)
from steno.services.worker.engine import EngineDead, EngineError, EngineOutput

log = logging.getLogger(__name__)

# Files that mean "a tokenizer lives here" (Hugging Face layouts).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "tiktoken.model")

FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "cancelled"}

# JSON has no -inf; OpenAI reports such log probabilities as -9999.0.
LOGPROB_FLOOR = -9999.0

# Abort orders for requests this engine has not seen (yet) are kept this long.
ABORT_MEMORY_S = 600.0

@dataclass(frozen=True)
class VllmOptions:
    """Engine arguments, named as vLLM names them."""

    model_path: str
    served_model_name: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool = False
    # Steno's own: the model's dialect (its format), how a text.format applies (see the
    # module docstring), and an optional bound on consecutive whitespace inside
    # constrained JSON (weak or random models can otherwise emit whitespace until
    # max_tokens).
    dialect: str = DEFAULT_DIALECT
    # A chat-template model's files (its dialect is built from them).
    dialect_files: ChatTemplateFiles | None = None
    structured_output_scope: StructuredOutputScope = "final"
    json_max_whitespace: int | None = None

    def model_dialect(self) -> Dialect:
        if self.dialect_files is not None:
            return chat_template_dialect(self.dialect_files)
        return dialect_named(self.dialect)

    def has_tokenizer(self) -> bool:
        if self.tokenizer:
            return True
        model = Path(self.model_path)
        if not model.is_dir():
            return True  # a hub name: vLLM resolves it (and its tokenizer) itself
        return any((model / name).exists() for name in TOKENIZER_FILES)

    def engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        kwargs: dict[str, Any] = {
            "model": self.model_path,
            "tokenizer": self.tokenizer,
            "skip_tokenizer_init": not self.has_tokenizer(),
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "tensor_parallel_size": self.tensor_parallel_size,
            "enforce_eager": self.enforce_eager,
            "disable_log_stats": True,
        }
        if self.served_model_name:
            kwargs["served_model_name"] = [self.served_model_name]
        if self.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        if self.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
        return AsyncEngineArgs(**kwargs)


def structured_outputs_params(
    structured: StructuredOutput, dialect: Dialect, scope: StructuredOutputScope, max_whitespace: int | None
) -> Any:
    import json

    from vllm.sampling_params import StructuredOutputsParams

    if structured.kind == "json_schema":
        if not isinstance(structured.json_schema, dict):
            raise EngineError("a json_schema text.format needs a schema object")
        schema = structured.json_schema
    else:
        schema = {"type": "object"}
    return StructuredOutputsParams(structural_tag=json.dumps(dialect.answer_grammar(schema, scope, max_whitespace)))


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else LOGPROB_FLOOR


def convert_logprobs(
    token_ids: list[int], step_logprobs: Any, top: int
) -> tuple[list[float], list[list[tuple[int, float]]] | None]:
    """vLLM's per-token ``{token_id: Logprob}`` (the sampled token plus the ``top`` most
    likely) -> the sampled token's logprob and, when ``top`` > 0, the top list by rank.
    Always one entry per token, so batches stay aligned with their token ids."""
    steps = list(step_logprobs or [])
    sampled: list[float] = []
    alternatives: list[list[tuple[int, float]]] = []
    for index, token in enumerate(token_ids):
        entries = steps[index] if index < len(steps) and steps[index] is not None else {}
        entry = entries.get(token)
        sampled.append(_finite(entry.logprob) if entry is not None else LOGPROB_FLOOR)
        if top > 0:
            ranked = sorted(
                (lp.rank if lp.rank is not None else math.inf, tid, lp.logprob) for tid, lp in entries.items()
            )
            alternatives.append([(tid, _finite(lp)) for rank, tid, lp in ranked if rank <= top][:top])
    return sampled, (alternatives if top > 0 else None)


class VllmEngine:
    name = "vllm"

    def __init__(self, llm: Any, options: VllmOptions, *, owns_llm: bool = True) -> None:
        """Wraps a started ``AsyncLLM``; ``start`` builds one from ``options``. Several
        engines may share one ``AsyncLLM`` (``owns_llm=False`` for all but one)."""
        self._llm = llm
        self._options = options
        self._owns_llm = owns_llm
        self._has_tokenizer = options.has_tokenizer()
        self._dialect = options.model_dialect()
        self._aborted: dict[str, float] = {}
        self._dead: BaseException | None = None
        self._died = asyncio.Event()
        self._closed = False

    @classmethod
    def start(cls, options: VllmOptions) -> VllmEngine:
        """Starts vLLM (blocking: it loads the model and spawns the engine core)."""
        from vllm.v1.engine.async_llm import AsyncLLM

        started = time.monotonic()
        llm = AsyncLLM.from_engine_args(options.engine_args())
        log.info(
            "vLLM engine up in %.1fs: %s (tokenizer: %s)",
            time.monotonic() - started,
            options.model_path,
            "yes" if options.has_tokenizer() else "none, skip_tokenizer_init",
        )
        return cls(llm, options)

    def view(self, **changes: Any) -> VllmEngine:
        """Another engine over the same ``AsyncLLM`` with other Steno-side options
        (e.g. ``structured_output_scope``); closing it leaves the ``AsyncLLM`` running."""
        from dataclasses import replace

        return VllmEngine(self._llm, replace(self._options, **changes), owns_llm=False)

    @property
    def llm(self) -> Any:
        return self._llm

    @property
    def context_tokens(self) -> int:
        return int(self._llm.model_config.max_model_len)

    @property
    def dead(self) -> BaseException | None:
        if self._dead is None and self._llm is not None and getattr(self._llm, "errored", False):
            self._died_of(getattr(self._llm, "dead_error", None) or RuntimeError("vLLM engine errored"))
        return self._dead

    def _died_of(self, cause: BaseException) -> None:
        if self._dead is None:
            self._dead = cause
            self._died.set()

    async def wait_until_dead(self, poll_s: float = 0.5) -> BaseException:
        """Returns the cause once the engine is gone: a request that met the dead engine
        core says so at once; an idle engine is found out by polling vLLM's flag."""
        while (dead := self.dead) is None:
            with suppress(TimeoutError):
                async with asyncio.timeout(poll_s):
                    await self._died.wait()
        return dead

    def sampling_params(self, sampling: SamplingParams) -> Any:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        kwargs: dict[str, Any] = {
            "n": 1,
            "max_tokens": sampling.max_tokens,  # None: up to the model's context length
            "temperature": 1.0 if sampling.temperature is None else sampling.temperature,
            "top_p": 1.0 if sampling.top_p is None else sampling.top_p,
            "seed": sampling.seed,
            "stop_token_ids": list(sampling.stop_token_ids),
            "logprobs": sampling.top_logprobs,
            "output_kind": RequestOutputKind.DELTA,
            "detokenize": False,
        }
        if sampling.structured_output is not None:
            if not self._has_tokenizer:
                raise EngineError(
                    "structured outputs (text.format) need the model's tokenizer; "
                    "this worker runs without one (start it with --tokenizer)"
                )
            kwargs["structured_outputs"] = structured_outputs_params(
                sampling.structured_output, self._dialect,
                self._options.structured_output_scope, self._options.json_max_whitespace
            )
        return VllmSamplingParams(**kwargs)

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        prior_output: Sequence[int] = (),
    ) -> AsyncIterator[EngineOutput]:
        """Streams the completion of ``prompt_token_ids``. With ``prior_output`` (what an
        earlier attempt already published) it continues after those tokens: they are
        appended to the prompt, and ``sampling.max_tokens`` counts new tokens only. A
        constrained (``text.format``) generation cannot be continued: the grammar would
        start again where the earlier attempt left it half-way."""
        from vllm import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        if self.dead is not None:
            raise EngineDead(f"the vLLM engine is dead: {self.dead}")
        if prior_output and sampling.structured_output is not None:
            raise EngineError("cannot continue a text.format (structured output) generation after a worker failover")
        try:
            params = self.sampling_params(sampling)
        except EngineError:
            raise
        except Exception as exc:  # vLLM validates while building its SamplingParams
            raise EngineError(f"invalid sampling parameters: {exc}") from exc
        if self._aborted.pop(request_id, None) is not None:
            yield EngineOutput([], finish_reason="cancelled")
            return
        top = sampling.top_logprobs or 0
        abort_sent = False
        prompt = TokensPrompt(prompt_token_ids=[*prompt_token_ids, *prior_output])
        stream = self._llm.generate(prompt, params, request_id)
        try:
            async with aclosing(stream):
                async for output in stream:
                    completion = output.outputs[0]
                    finish = self._finish_reason(completion.finish_reason)
                    token_ids = list(completion.token_ids)
                    logprobs = top_logprobs = None
                    if sampling.top_logprobs is not None:
                        logprobs, top_logprobs = convert_logprobs(token_ids, completion.logprobs, top)
                    yield EngineOutput(
                        token_ids,
                        logprobs=logprobs,
                        top_logprobs=top_logprobs,
                        finish_reason=finish,
                        cached_tokens=getattr(output, "num_cached_tokens", None),
                    )
                    if finish is not None:
                        return
                    if not abort_sent and request_id in self._aborted:
                        # The abort came before vLLM knew the request; send it again.
                        abort_sent = True
                        await self._llm.abort(request_id)
        except EngineDeadError as exc:
            self._died_of(exc)
            raise EngineDead(f"the vLLM engine died: {exc}") from exc
        except EngineError:
            raise
        except Exception as exc:
            cause = exc.__cause__ or exc
            raise EngineError(f"vLLM failed the request: {type(cause).__name__}: {cause}") from exc
        finally:
            self._aborted.pop(request_id, None)

    def _finish_reason(self, reason: str | None) -> FinishReason | None:
        if reason is None:
            return None
        mapped = FINISH_REASONS.get(str(reason))
        if mapped is None:
            raise EngineError(f"vLLM ended the request with finish reason {reason!r}")
        return mapped

    async def abort(self, request_id: str) -> None:
        now = time.monotonic()
        for stale in [rid for rid, at in self._aborted.items() if now - at > ABORT_MEMORY_S]:
            del self._aborted[stale]
        self._aborted[request_id] = now
        if self.dead is None:
            await self._llm.abort(request_id)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._aborted.clear()
        if self._owns_llm and self._llm is not None:
            llm, self._llm = self._llm, None
            llm.shutdown()
            # AsyncLLM.__del__ shuts down again, at interpreter exit when it is still
            # referenced somewhere, with half the modules gone (a noisy TypeError).
            llm.shutdown = lambda *args, **kwargs: None
