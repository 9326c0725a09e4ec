"""Coalesces engine outputs into token batches: the first tokens as they come, then at
most one batch per interval (or per N tokens), one batch in flight at a time.

The interval counts from the previous batch's sending, so a stream whose engine steps
about once an interval sends each step's token as it comes, every stream on the same
step, and a worker's batches of one step go out together (``batch_groups.py``). Once the
stores fall behind the steps, the worker's window widens and counts from each store
instead, which makes batches grow with the pipeline's backlog (``CoalescingWindow``).

The task that reads the engine coalesces as it reads, and nothing waits in a task for a
batch's store: the batch's future calls back once it is stored, and the next batch goes
from there, or from a timer at the interval's end. A token then wakes the worker once
(for the engine's output), not three times (the engine's reader, a coalescing task,
and that task again when its batch was stored)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
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


# Starts storing a batch; the future resolves once it is stored.
Flush = Callable[[PendingBatch], "asyncio.Future[None]"]


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
# Weight of each batch in a worker's running share of batches held up by a store: about
# a second of a few hundred streams' batches (they all speak on the same engine step, so
# a shorter run sees only where that step falls against the stores).
SMOOTHING = 1 / 8192
# The window widens once this share of batches found the batch before them still being
# stored when their first token came (docs/performance.md has the shares measured at
# several stream counts) ...
WIDEN_AT_HELD = 0.1
# ... and stays wide this long; then the base interval is tried again, the share
# starting from here.
WIDE_HOLD_S = 5.0
RETRY_SHARE = 0.08


class CoalescingWindow:
    """A worker's coalescing window, shared by its streams: ``interval_s`` counted from
    each batch's sending while the stores keep up with the engine's steps, so that a
    stream speaking about once an interval gets every token out as it comes, on the step
    it came on; twice that, counted from each batch's store, once many batches
    (``WIDEN_AT_HELD``) find the batch before them still being stored when their first
    token comes. Sent as they come while the stores lag, each token would go alone and
    the stores would lag further; the wider window carries the next steps' tokens in the
    same batch, and more of them the longer the stores take (docs/performance.md, "The
    window paced by the steps"). Its fewer messages are quicker to store, so whether
    batches would be held up at the base interval cannot be read while it is wide: after
    ``WIDE_HOLD_S`` the base interval is tried again, the share counted afresh from
    ``RETRY_SHARE``."""

    def __init__(self, interval_s: float, adaptive: bool = True) -> None:
        self.interval_s = interval_s
        self._adaptive = adaptive
        self._held = 0.0
        self._wide_until: float | None = None

    @property
    def widened(self) -> bool:
        return self._wide_until is not None

    @property
    def held_share(self) -> float:
        """The running share of batches held up by the store of the batch before them."""
        return self._held

    def record(self, held: bool, now: float) -> None:
        """A batch sent at ``now`` (monotonic): whether its first token came while the
        batch before it was being stored."""
        if not self._adaptive:
            return
        if self._wide_until is not None:
            if now >= self._wide_until:
                self._wide_until, self._held = None, RETRY_SHARE
            return
        self._held += (held - self._held) * SMOOTHING
        if self._held > WIDEN_AT_HELD:
            self._wide_until = now + WIDE_HOLD_S

    @property
    def window_s(self) -> float:
        return self.interval_s * 2 if self._wide_until is not None else self.interval_s


async def coalesce(
    outputs: AsyncIterator[EngineOutput],
    flush: Flush,
    interval_s: float | CoalescingWindow,
    max_tokens: int,
    keepalive_s: float | None = None,
    eager_tokens: int = EAGER_TOKENS,
) -> tuple[EngineOutput | None, PendingBatch]:
    """Drains ``outputs`` into ``flush`` calls, all but the last batch: returns the output
    that carried the finish reason (None when the engine stopped without one) and the
    last batch, which goes out with the attempt's end, once every batch before it is
    stored. Until ``eager_tokens`` tokens are out every output goes as soon as the batch
    before it is stored (time to first content is what users feel); after that a batch
    goes ``interval_s`` after the previous one was sent, and not before that one is
    stored, or at once when the stream was quiet for most of the interval
    (``QUIET_SHARE``), so a stream costs at most about one message per interval. Given a
    worker's ``CoalescingWindow`` instead of a fixed interval, the interval is the
    window's, counted from the previous batch's store while it is wide, and each batch
    after the eager ones is counted there. After
    ``keepalive_s`` without a flush it flushes an empty batch, which the parser turns
    into a keepalive event. A batch that is not stored
    fails the call at once, whatever the engine is doing."""
    coalescer = _Coalescer(flush, interval_s, max_tokens, keepalive_s, eager_tokens)
    last: EngineOutput | None = None
    try:
        try:
            async for output in outputs:
                if last is None:  # anything after the finish is not the response's
                    coalescer.add(output, time.time())
                    if output.finish_reason is not None:
                        last = output
        except asyncio.CancelledError:
            failure = coalescer.failure
            task = asyncio.current_task()
            # Cancelled by a batch that failed, and by nothing else: that failure is the outcome.
            if failure is not None and coalescer.cancelled_reader and task is not None and task.uncancel() == 0:
                raise failure from None
            raise
        except Exception:
            if coalescer.failure is not None:
                raise
            # The engine failed: what it said before goes out first.
            await coalescer.settle()
            if coalescer.pending.token_ids:
                await flush(coalescer.pending)
            raise
        await coalescer.settle()
        return last, coalescer.pending
    finally:
        coalescer.close()
        if isinstance(outputs, AsyncGenerator):
            await outputs.aclose()  # left at a yield when a batch failed: the engine lets it go now


class _Coalescer:
    """One attempt's batching, driven by its outputs, its batches' stores and one timer."""

    def __init__(self, flush: Flush, interval_s: float | CoalescingWindow, max_tokens: int,
                 keepalive_s: float | None, eager_tokens: int) -> None:
        self._flush = flush
        self._window = (interval_s if isinstance(interval_s, CoalescingWindow)
                        else CoalescingWindow(interval_s, adaptive=False))
        self._max_tokens = max_tokens
        self._keepalive_s = keepalive_s
        self._eager_tokens = eager_tokens
        self.pending = PendingBatch()
        self.failure: BaseException | None = None
        self._in_flight: asyncio.Future[None] | None = None
        # Resolved once the batch in flight has been handled (``_stored``), for ``settle``.
        self._handled: asyncio.Future[None] | None = None
        # When the batch before was sent and when it was stored (monotonic): the base
        # interval counts from the first, a wide window and the keepalive from the second.
        self._last_sent = self._last_stored = time.monotonic()
        # Whether the pending batch's first token came while the batch before it was in flight.
        self._held = False
        self._flushed_tokens = 0
        self._closed = False
        # The task reading the engine: a batch that fails while it waits there cancels the
        # wait (``cancelled_reader``), which ``coalesce`` tells from any other cancel.
        self._reader = asyncio.current_task()
        self.cancelled_reader = False
        self._timer = WakeTimer(self._consider)
        self._consider()

    def add(self, output: EngineOutput, emitted_at: float) -> None:
        """Adds the output to the pending batch; the one that finishes stays there, to go
        out with the attempt's end."""
        if self._in_flight is not None and not self.pending.token_ids:
            self._held = True
        self.pending.add(output, emitted_at)
        if output.finish_reason is not None:
            self.close()
            return
        self._consider()
        if self.failure is not None:
            raise self.failure

    async def settle(self) -> None:
        """Sends nothing more; returns once the batch in flight is stored and every callback
        of its has run (the future alone may be done with them still to come)."""
        self.close()
        if self._in_flight is not None:
            self._handled = asyncio.get_running_loop().create_future()
            await self._handled
        if self.failure is not None:
            raise self.failure

    def close(self) -> None:
        self._closed = True
        self._timer.cancel()

    def _consider(self) -> None:
        """Sends the pending batch if it is due, else wakes again when it will be."""
        if self._closed or self._in_flight is not None:
            return  # the batch in flight, once stored, considers again
        now = time.monotonic()
        tokens = len(self.pending.token_ids)
        if tokens:
            interval_s = self._window.window_s
            since = self._last_stored if self._window.widened else self._last_sent
            due = since + interval_s
            if (now >= due or tokens >= self._max_tokens or self._flushed_tokens < self._eager_tokens
                    or now >= since + QUIET_SHARE * interval_s):
                self._send(now)
            else:
                self._timer.at(due)
        elif self._keepalive_s is not None:
            due = self._last_stored + self._keepalive_s
            if now >= due:
                self._send(now)
            else:
                self._timer.at(due)

    def _send(self, now: float) -> None:
        batch, self.pending = self.pending, PendingBatch()
        held, self._held = self._held, False
        if batch.token_ids and self._flushed_tokens >= self._eager_tokens:
            self._window.record(held, now)
        self._flushed_tokens += len(batch.token_ids)
        self._last_sent = now
        try:
            stored = self._flush(batch)
        except Exception as exc:
            self._fail(exc)
            return
        self._in_flight = stored
        stored.add_done_callback(self._stored)

    def _stored(self, stored: asyncio.Future[None]) -> None:
        self._in_flight = None
        failure = RuntimeError("storing a batch was cancelled") if stored.cancelled() else stored.exception()
        if failure is not None:
            self._fail(failure)
        else:
            self._last_stored = time.monotonic()
            self._consider()
        if self._handled is not None and not self._handled.done():
            self._handled.set_result(None)

    def _fail(self, failure: BaseException) -> None:
        if self.failure is None:
            self.failure = failure
        if self._closed:
            return  # the reader is not waiting on the engine: it hears of it where it is
        self.close()
        if self._reader is not None and asyncio.current_task() is not self._reader:
            self.cancelled_reader = True
            self._reader.cancel()
