"""What earlier attempts of a request already published, read back from the TOKENS
stream, so a worker that takes a request over continues it instead of starting again.

The batches are taken in the order, and by the rule, the parser applies them
(``TokenStreamOrder``): what the parser would not apply is not continued either."""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from steno.schemas.bus import (
    Placement,
    TokenBatch,
    TokenStreamMessage,
    TokenStreamOrder,
    token_partition_message,
    unpacked,
)
from steno.services.common.bus import Names, partition_of

READ_BATCH = 512
FETCH_TIMEOUT_S = 0.5
READ_PATIENCE_S = 15.0
# The groups are read from a little before the request was queued: the two streams'
# timestamps may come from different servers' clocks.
CLOCK_MARGIN = datetime.timedelta(seconds=60)


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
                            since: datetime.datetime | None = None,
                            patience_s: float = READ_PATIENCE_S) -> PriorOutput:
    """Everything published for the response so far: on its token subject, and in the
    groups of its partition (``TokenBatchGroup``) stored from ``since`` on (when the
    request was queued: nothing of it was published before; None reads them all). A
    slow read is not an empty one: each reading consumer says how many messages it has
    to read, and a read that gets fewer within ``patience_s`` raises (the request goes
    back and is tried again), since continuing after a shorter prefix than was published
    would fail the response."""
    deadline = time.monotonic() + patience_s
    groups_from = since - CLOCK_MARGIN if since is not None else None
    partition = partition_of(response_id, names.token_partitions)
    read = (await _read(js, names, names.tokens_subject(response_id), response_id, deadline)
            + await _read(js, names, names.tokens_group_subject(partition), response_id, deadline, groups_from))
    # In the order they were stored, which is the order they were published in.
    return assemble([message for _, message in sorted(read, key=lambda sequenced: sequenced[0])])


async def _read(js: JetStreamContext, names: Names, subject: str, response_id: str, deadline: float,
                stored_from: datetime.datetime | None = None) -> list[tuple[int, TokenStreamMessage]]:
    """The response's messages among those stored on ``subject`` (from ``stored_from``
    on, if given), with their stream sequence numbers."""
    config = ConsumerConfig(ack_policy=AckPolicy.NONE, inactive_threshold=30.0, deliver_policy=DeliverPolicy.ALL)
    if stored_from is not None:
        config.deliver_policy, config.opt_start_time = DeliverPolicy.BY_START_TIME, stored_from
    subscription = await js.pull_subscribe(subject, stream=names.tokens_stream, config=config)
    messages: list[tuple[int, TokenStreamMessage]] = []
    try:
        stored = (await subscription.consumer_info()).num_pending or 0
        read = 0
        while read < stored:
            if time.monotonic() > deadline:
                raise PriorOutputUnread(f"read {read} of the {stored} messages on {subject} for {response_id}")
            try:
                fetched = await subscription.fetch(READ_BATCH, timeout=FETCH_TIMEOUT_S)
            except (TimeoutError, NatsTimeoutError):
                continue
            read += len(fetched)
            for msg in fetched:
                try:
                    carried = unpacked(token_partition_message.validate_json(msg.data), None)
                except ValidationError:
                    continue
                messages += [(msg.metadata.sequence.stream, message) for message, _ in carried
                             if message.response_id == response_id]
    finally:
        await subscription.unsubscribe()
    return messages


class PriorOutputUnread(Exception):
    """The earlier attempts' output could not be read in time."""
