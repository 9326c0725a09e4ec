"""What earlier attempts of a request already published, read back from the TOKENS
stream, so a worker that takes a request over continues it instead of starting again.

The batches are taken in the order, and by the rule, the parser applies them
(``TokenStreamOrder``): what the parser would not apply is not continued either."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from steno.schemas.bus import Placement, TokenBatch, TokenStreamMessage, TokenStreamOrder, token_stream_message
from steno.services.common.bus import Names

READ_BATCH = 512
FETCH_TIMEOUT_S = 0.5
READ_PATIENCE_S = 15.0


@dataclass
class PriorOutput:
    token_ids: list[int] = field(default_factory=list)
    # The response already ended (an earlier attempt published its end, or diverged).
    ended: bool = False


def assemble(messages: list[TokenStreamMessage]) -> PriorOutput:
    """What the messages read back (in stream order) say was published."""
    prior = PriorOutput()
    order = TokenStreamOrder()
    for message in messages:
        placement = order.place(message)
        if placement is Placement.DIVERGED:
            # The response fails there (the parser records the failure).
            prior.ended = True
            break
        if placement is not Placement.NEXT:
            continue
        order.advance(message)
        if isinstance(message, TokenBatch):
            prior.token_ids += message.token_ids
            if message.ended is not None and order.place(message.ended) is Placement.NEXT:
                order.advance(message.ended)
        prior.ended = order.ended
    return prior


async def read_prior_output(js: JetStreamContext, names: Names, response_id: str,
                            patience_s: float = READ_PATIENCE_S) -> PriorOutput:
    """Everything published on the response's token subject so far. A slow read is not an
    empty one: the reading consumer says how many messages the subject holds, and a read
    that gets fewer within ``patience_s`` raises (the request goes back and is tried
    again), since continuing after a shorter prefix than was published would fail the
    response."""
    subscription = await js.pull_subscribe(
        names.tokens_subject(response_id),
        stream=names.tokens_stream,
        config=ConsumerConfig(
            ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=30.0
        ),
    )
    messages: list[TokenStreamMessage] = []
    try:
        stored = (await subscription.consumer_info()).num_pending or 0
        read = 0
        deadline = time.monotonic() + patience_s
        while read < stored:
            if time.monotonic() > deadline:
                raise PriorOutputUnread(f"read {read} of the {stored} messages published for {response_id}")
            try:
                fetched = await subscription.fetch(READ_BATCH, timeout=FETCH_TIMEOUT_S)
            except (TimeoutError, NatsTimeoutError):
                continue
            read += len(fetched)
            for msg in fetched:
                try:
                    messages.append(token_stream_message.validate_json(msg.data))
                except ValidationError:
                    continue
    finally:
        await subscription.unsubscribe()
    return assemble(messages)


class PriorOutputUnread(Exception):
    """The earlier attempts' output could not be read in time."""
