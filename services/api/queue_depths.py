"""Keeps the queue gauges current: every few seconds, the consumers of the work stream
and the token stream as JetStream reports them (two requests), so that a scrape reads
cached values and never waits on NATS."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.js import JetStreamContext

from steno.services.common.bus import Names
from steno.services.common.metrics import consumer_states, publish_queue_depths, token_stream_lags, work_queue_depths

log = logging.getLogger(__name__)

REFRESH_EVERY_S = 5.0


async def refresh_queue_depths(js: JetStreamContext, names: Names, models: Callable[[], list[str]]) -> None:
    """Refreshes the gauges until cancelled; ``models``: the models served now."""
    partitions = {names.parser_consumer(p): p for p in range(names.token_partitions)}
    while True:
        try:
            consumer_models = {}
            for model in models():
                consumer_models[names.worker_consumer(model)] = model
                consumer_models.update({names.affinity_consumer(model, shard): model
                                        for shard in range(names.affinity_shards)})
            publish_queue_depths(work_queue_depths(await consumer_states(js, names.gen_stream), consumer_models)
                                 + token_stream_lags(await consumer_states(js, names.tokens_stream), partitions))
        except Exception as exc:
            log.warning("reading the queues' depths failed (%s); the gauges keep their last values", exc)
        await asyncio.sleep(REFRESH_EVERY_S)
