"""What earlier attempts of a request already published, read back from the TOKENS
stream, so a worker that takes a request over continues it instead of starting again.

The batches are taken in the order, and by the rule, the parser applies them
(``TokenStreamOrder``): what the parser would not apply is not continued either."""

from __future__ import annotations

from dataclasses import dataclass, field

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from steno.schemas.bus import Placement, TokenBatch, TokenStreamMessage, TokenStreamOrder, token_stream_message
from steno.services.common.bus import Names

READ_BATCH = 512


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


async def read_prior_output(js: JetStreamContext, names: Names, response_id: str) -> PriorOutput:
    subscription = await js.pull_subscribe(
        names.tokens_subject(response_id),
        stream=names.tokens_stream,
        config=ConsumerConfig(
            ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, inactive_threshold=30.0
        ),
    )
    messages: list[TokenStreamMessage] = []
    try:
        while True:
            try:
                fetched = await subscription.fetch(READ_BATCH, timeout=0.5)
            except (TimeoutError, NatsTimeoutError):
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
