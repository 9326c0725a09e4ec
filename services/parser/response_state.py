"""One response's parse state: token batches in order -> events (pure, no I/O).

Batches are applied strictly in (attempt, batch_no) order; a batch seen before is
reported as a duplicate so redeliveries leave the log untouched."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openai_harmony import HarmonyEncoding

from steno.schemas.bus import GenerationEnded, TokenBatch
from steno.schemas.events import LoggedEvent
from steno.schemas.responses import ParseContext
from steno.services.parser.harmony import HarmonyStreamSplitter
from steno.services.parser.response_builder import ResponseBuilder


class OutOfOrder(Exception):
    """A batch arrived ahead of one it follows; it must be retried later."""


@dataclass(frozen=True)
class Applied:
    events: list[LoggedEvent]
    finished: bool


class ResponseState:
    def __init__(
        self,
        response_id: str,
        base_snapshot: dict[str, Any],
        context: ParseContext,
        encoding: HarmonyEncoding,
    ) -> None:
        self.response_id = response_id
        self._encoding = encoding
        self._splitter = HarmonyStreamSplitter(encoding)
        self._builder = ResponseBuilder(response_id, base_snapshot, context, self._decode_token)
        self._context = context
        self._started = False
        self.attempt = 0
        self.next_batch_no = 0
        self.output_tokens = 0
        self.finished = False

    def _decode_token(self, token_id: int) -> str:
        return self._encoding.decode([token_id])

    @property
    def started(self) -> bool:
        return self._started

    @property
    def final_snapshot(self) -> dict[str, Any] | None:
        return self._builder.final_snapshot

    def is_duplicate(self, attempt: int, batch_no: int) -> bool:
        return self.finished or (attempt, batch_no) < (self.attempt, self.next_batch_no)

    def _check_order(self, attempt: int, batch_no: int) -> None:
        if attempt == self.attempt and batch_no == self.next_batch_no:
            return
        if attempt > self.attempt and batch_no == 0:
            # A new attempt (another worker took the request over) starts numbering again.
            self.attempt, self.next_batch_no = attempt, 0
            return
        raise OutOfOrder(f"{self.response_id}: got {attempt}/{batch_no}, expected {self.attempt}/{self.next_batch_no}")

    def _start_events(self) -> list[LoggedEvent]:
        if self._started:
            return []
        self._started = True
        return self._builder.start()

    def failure(self, message: str) -> GenerationEnded:
        """The end to record for a response the pipeline cannot finish (it is applied like
        any end, and stored, so a re-parse reaches the same failure)."""
        return GenerationEnded(
            response_id=self.response_id,
            attempt=self.attempt,
            batch_count=self.next_batch_no,
            finish_reason="error",
            prompt_tokens=self._context.prompt_tokens,
            output_tokens=self.output_tokens,
            error_code="server_error",
            error_message=message,
        )

    def apply(self, message: TokenBatch | GenerationEnded) -> Applied | None:
        """Applies a message from the token stream (a last batch: the batch, then its
        end); None for a duplicate."""
        if isinstance(message, GenerationEnded):
            return self.apply_end(message)
        applied = self.apply_batch(message)
        if message.ended is None or self.finished:
            return applied
        ended = self.apply_end(message.ended)
        if applied is None or ended is None:
            return applied or ended
        return Applied(applied.events + ended.events, finished=ended.finished)

    def apply_batch(self, batch: TokenBatch) -> Applied | None:
        if self.is_duplicate(batch.attempt, batch.batch_no):
            return None
        continues = batch.attempt == self.attempt
        self._check_order(batch.attempt, batch.batch_no)
        if not continues and batch.resumed_after not in (None, self.output_tokens):
            diverged = self.failure(
                f"A worker took the request over after {batch.resumed_after} tokens, but {self.output_tokens}"
                " had been published: the output cannot be continued."
            )
            return self.apply_end(diverged)
        events = self._start_events()
        if not batch.token_ids:
            # The worker's keepalive after a long silence: say the response is alive.
            events = events or self._builder.keepalive()
        else:
            fragments = self._splitter.feed(batch.token_ids)
            events += self._builder.consume(fragments, batch.token_ids, batch.logprobs, batch.top_logprobs)
        self.next_batch_no += 1
        self.output_tokens += len(batch.token_ids)
        return Applied(events, finished=False)

    def apply_end(self, ended: GenerationEnded) -> Applied | None:
        if self.is_duplicate(ended.attempt, ended.batch_count):
            return None
        self._check_order(ended.attempt, ended.batch_count)
        events = self._start_events()
        events += self._builder.finish(ended, self._splitter.reasoning_tokens)
        self.finished = True
        return Applied(events, finished=True)
