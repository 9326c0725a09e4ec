"""Coalesces engine outputs into token batches: the first tokens as they come, then at
most one batch per interval (or per N tokens)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from steno.services.common.wake_timer import WakeTimer
from steno.services.worker.engine import EngineOutput


@dataclass
class PendingBatch:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # When the engine emitted the first and the last token added (unix seconds):
    # TokenBatch.first_emitted_at and emitted_at.
    first_emitted_at: float | None = None
    emitted_at: float | None = None

    def add(self, output: EngineOutput, emitted_at: float) -> None:
        self.token_ids += output.token_ids
        if output.token_ids:
            if self.first_emitted_at is None:
                self.first_emitted_at = emitted_at
            self.emitted_at = emitted_at
        if output.logprobs is not None:
            self.logprobs = (self.logprobs or []) + output.logprobs
        if output.top_logprobs is not None:
            self.top_logprobs = (self.top_logprobs or []) + output.top_logprobs


Flush = Callable[[PendingBatch], Awaitable[None]]
_WAKE = object()


# What a client waits for before it sees anything: the answer's message header (in
# Harmony ``<|channel|>final<|constrain|>json<|message|>``, after a short or empty
# analysis message) and the first words. An engine emitting one token per step costs at
# most this many extra messages per response.
EAGER_TOKENS = 32
# A stream quiet for this share of the interval since its last batch sends its next
# token at once: one whose tokens come about once an interval (an engine stepping at
# about that rate) would otherwise wait out the interval's last moments, a step's jitter
# deciding, for no fewer messages.
QUIET_SHARE = 0.75


async def coalesce(
    outputs: AsyncIterator[EngineOutput],
    flush: Flush,
    interval_s: float,
    max_tokens: int,
    keepalive_s: float | None = None,
    eager_tokens: int = EAGER_TOKENS,
) -> tuple[EngineOutput | None, PendingBatch]:
    """Drains ``outputs`` into ``flush`` calls, all but the last batch: returns the output
    that carried the finish reason (None when the engine stopped without one) and the
    last batch, which goes out with the attempt's end. Until ``eager_tokens`` tokens are
    out every output goes at once (time to first content is what users feel); after
    that a batch goes ``interval_s`` after the previous one, or at once when the stream
    was quiet for most of that (``QUIET_SHARE``), so a stream costs at most about one
    message per interval. After
    ``keepalive_s`` without a flush it flushes an empty batch, which the parser turns
    into a keepalive event."""
    queue: asyncio.Queue[tuple[EngineOutput, float] | object | None] = asyncio.Queue()

    async def produce() -> None:
        try:
            async for output in outputs:
                await queue.put((output, time.time()))
        finally:
            await queue.put(None)

    # A deadline (the interval's end, the keepalive's) wakes the loop by a mark in the
    # queue (a timeout around each wait cost a timer scheduled and cancelled per token).
    wake = WakeTimer(queue, _WAKE)
    producer = asyncio.create_task(produce())
    pending = PendingBatch()
    deadline: float | None = None
    last: EngineOutput | None = None
    last_flush = time.monotonic()
    flushed_tokens = 0
    try:
        while True:
            keepalive_at = last_flush + keepalive_s if keepalive_s is not None else None
            wake.at(deadline if deadline is not None else keepalive_at)
            received = await queue.get()
            # What else came meanwhile goes in the same batch.
            while isinstance(received, tuple) and received[0].finish_reason is None and not queue.empty():
                pending.add(*received)
                received = queue.get_nowait()
            if received is None:
                break
            if isinstance(received, tuple):
                output, emitted_at = received
                pending.add(output, emitted_at)
                if output.finish_reason is not None:
                    last = output
                    break
            now = time.monotonic()
            if not pending.token_ids:
                if keepalive_s is not None and now >= last_flush + keepalive_s:
                    await flush(PendingBatch())
                    last_flush = time.monotonic()
            else:
                if deadline is None:
                    deadline = last_flush + interval_s
                if (now >= deadline or len(pending.token_ids) >= max_tokens or flushed_tokens < eager_tokens
                        or now >= last_flush + QUIET_SHARE * interval_s):
                    flushed_tokens += len(pending.token_ids)
                    await flush(pending)
                    pending, deadline = PendingBatch(), None
                    last_flush = time.monotonic()
        try:
            await producer  # re-raises what the engine raised
        except BaseException:
            if pending.token_ids:
                await flush(pending)
            raise
        return last, pending
    finally:
        producer.cancel()
        wake.cancel()
