"""One response's parse state: token batches in order -> events (pure, no I/O).

Messages apply in the token stream's order (``TokenStreamOrder``, the rule a worker
taking a request over follows too); one seen before is reported as a duplicate, so
redeliveries leave the log untouched."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from steno.schemas.bus import (
    GenerationEnded,
    Placement,
    TokenBatch,
    TokenStreamMessage,
    TokenStreamOrder,
    stream_position,
)
from steno.schemas.chain import event_hash
from steno.schemas.events import LoggedEvent
from steno.schemas.responses import ParseContext
from steno.services.common.reasoning_seal import ReasoningSeal
from steno.services.dialects import dialect_for
from steno.services.parser.response_builder import ResponseBuilder


def _seal_for(seal: ReasoningSeal, key_id: str, tenant: str, text: str, item_id: str) -> str:
    return seal.seal(text, tenant=tenant, item_id=item_id, key_id=key_id)


class OutOfOrder(Exception):
    """A batch arrived ahead of one it follows; it must be retried later."""


@dataclass(frozen=True)
class Applied:
    events: list[LoggedEvent]
    finished: bool
    # What to record in the response's stored token stream for this step: what was
    # applied, so that re-parsing the record reaches the same events.
    recorded: list[TokenStreamMessage]


class ResponseState:
    def __init__(self, response_id: str, base_snapshot: dict[str, Any], context: ParseContext,
                 clock: Callable[[], float] = time.time, seal: ReasoningSeal | None = None,
                 chain_head: bytes | None = None) -> None:
        """``clock`` dates the ends the parser records itself (a failure). ``seal``: the
        keys that seal reasoning, for a response whose reasoning is sealed; one that
        asks for a key they do not hold fails at its first batch. ``chain_head``: the
        hash of the API's last stored event, which the first event made here chains to
        (``schemas/chain.py``); None for a response stored before the chain, whose
        events stay without hashes."""
        self.response_id = response_id
        self.model: str = base_snapshot.get("model", "")
        self.chain_head = chain_head
        self._clock = clock
        dialect = dialect_for(context.dialect, context.dialect_files)
        self._splitter = dialect.splitter(context)
        sealing = context.reasoning_sealing
        sealer = None
        self._unsealable = sealing is not None and (seal is None or not seal.knows(sealing.key_id))
        if sealing is not None and seal is not None and not self._unsealable:
            sealer = partial(_seal_for, seal, sealing.key_id, sealing.tenant)
        self._builder = ResponseBuilder(response_id, base_snapshot, context, dialect.token_text,
                                        seal_reasoning=sealer)
        self._context = context
        self._order = TokenStreamOrder()
        self._started = False

    @property
    def started(self) -> bool:
        return self._started

    @property
    def finished(self) -> bool:
        return self._order.ended

    @property
    def final_snapshot(self) -> dict[str, Any] | None:
        return self._builder.final_snapshot

    def has_applied(self, message: TokenStreamMessage) -> bool:
        """Whether the stream is past ``message`` already (a redelivery), told without applying it."""
        return self._order.place(message) is Placement.DUPLICATE

    def _start_events(self) -> list[LoggedEvent]:
        if self._started:
            return []
        self._started = True
        return self._builder.start()

    def failure(self, message: str, attempt: int | None = None) -> GenerationEnded:
        """The end to record for a response the pipeline cannot finish (it is applied like
        any end, and stored, so a re-parse reaches the same failure): next in the current
        attempt, or first in a later ``attempt``."""
        order = self._order
        later = attempt is not None and attempt != order.attempt
        return GenerationEnded(
            response_id=self.response_id,
            attempt=attempt if attempt is not None else order.attempt,
            batch_count=0 if later else order.next_batch_no,
            finish_reason="error",
            prompt_tokens=self._context.prompt_tokens,
            output_tokens=order.output_tokens,
            error_code="server_error",
            error_message=message,
            completed_at=int(self._clock()),
        )

    def _placed(self, message: TokenStreamMessage) -> Placement:
        placement = self._order.place(message)
        if placement is Placement.AHEAD:
            attempt, number = stream_position(message)
            raise OutOfOrder(f"{self.response_id}: got {attempt}/{number}, "
                             f"expected {self._order.attempt}/{self._order.next_batch_no}")
        return placement

    def apply(self, message: TokenStreamMessage) -> Applied | None:
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
        # The batch's row carries its end.
        return Applied(applied.events + ended.events, finished=ended.finished, recorded=applied.recorded)

    def apply_batch(self, batch: TokenBatch) -> Applied | None:
        placement = self._placed(batch)
        if placement is Placement.DUPLICATE:
            return None
        if placement is Placement.DIVERGED:
            return self.apply_end(self.failure(
                f"A worker took the request over after {batch.resumed_after} tokens, but "
                f"{self._order.output_tokens} had been published: the output cannot be continued.",
                attempt=batch.attempt,
            ))
        if self._unsealable:
            return self.apply_end(self.failure(
                "The key that seals this response's reasoning (include reasoning.encrypted_content) "
                "is not held by this server any more."))
        events = self._start_events()
        if not batch.token_ids:
            # The worker's keepalive after a long silence: say the response is alive.
            events = events or self._builder.keepalive()
        else:
            fragments = self._splitter.feed(batch.token_ids)
            events += self._builder.consume(fragments, batch.token_ids, batch.logprobs, batch.top_logprobs)
        self._order.advance(batch)
        return Applied(self._chained(events), finished=False, recorded=[batch])

    def apply_end(self, ended: GenerationEnded) -> Applied | None:
        if self._placed(ended) is Placement.DUPLICATE:
            return None
        events = self._start_events()
        events += self._builder.consume(self._splitter.finish(), [], None, None)
        events += self._builder.finish(ended, self._splitter.reasoning_tokens)
        self._order.advance(ended)
        return Applied(self._chained(events), finished=True, recorded=[ended])

    def _chained(self, events: list[LoggedEvent]) -> list[LoggedEvent]:
        """The events with their hashes. Hashed here, as they are made, so that a state
        rebuilt by replaying the stored batches reaches the same chain head, and a
        rewrite of a row already stored carries the same hash."""
        head = self.chain_head
        if head is None:
            return events
        for event in events:
            head = event.hash = event_hash(head, event.payload)
        self.chain_head = head
        return events
