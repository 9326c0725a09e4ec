"""What earlier attempts of a request already published, read back from the TOKENS
stream, so a worker that takes a request over continues it instead of starting again.

The batches are taken in the order, and by the rules, the parser applies them (see
services/parser/response_state.py): strictly increasing (attempt, batch_no), a new
attempt starting at batch 0 and continuing after every token before it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from steno.schemas.bus import GenerationEnded, TokenBatch, token_stream_message
from steno.services.common.bus import Names

READ_BATCH = 512


@dataclass
class PriorOutput:
    token_ids: list[int] = field(default_factory=list)
    # The response already ended (an earlier attempt published its end, or diverged).
    ended: bool = False


def assemble(messages: list[TokenBatch | GenerationEnded]) -> PriorOutput:
    prior = PriorOutput()
    attempt, next_batch = 0, 0
    for message in messages:
        number = message.batch_no if isinstance(message, TokenBatch) else message.batch_count
        if prior.ended or (message.attempt, number) < (attempt, next_batch):
            continue
        if message.attempt > attempt and number == 0:
            resumed = message.resumed_after if isinstance(message, TokenBatch) else None
            if resumed is not None and resumed != len(prior.token_ids):
                prior.ended = True
                continue
            attempt, next_batch = message.attempt, 0
        elif (message.attempt, number) != (attempt, next_batch):
            continue
        if isinstance(message, GenerationEnded):
            prior.ended = True
        else:
            prior.token_ids += message.token_ids
            next_batch += 1
            prior.ended = message.ended is not None
    return prior


async def read_prior_output(js: JetStreamContext, names: Names, response_id: str) -> PriorOutput:
    subscription = await js.pull_subscribe(
        names.tokens_subject(response_id),
        stream=names.tokens_stream,
        config=ConsumerConfig(
            ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=30.0
        ),
    )
    messages: list[TokenBatch | GenerationEnded] = []
    try:
        while True:
            try:
                fetched = await subscription.fetch(READ_BATCH, timeout=0.5)
            except (NatsTimeoutError, asyncio.TimeoutError):
                break
            for msg in fetched:
                try:
                    messages.append(token_stream_message.validate_json(msg.data))
                except ValidationError:
                    continue
            if fetched[-1].metadata.num_pending == 0:
                break
    finally:
        await subscription.unsubscribe()
    return assemble(messages)
