"""Keeps the queue gauges current: every few seconds, the consumers of the work stream
and the token stream as JetStream reports them (two requests), so that a scrape reads
cached values and never waits on NATS."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats.js import JetStreamContext

from steno.services.common.bus import Names
from steno.services.common.metrics import ConsumerState, publish_queue_depths, token_stream_lags, work_queue_depths

log = logging.getLogger(__name__)

REFRESH_EVERY_S = 5.0
# JetStream lists at most this many consumers per request.
_PAGE = 256


async def _consumers(js: JetStreamContext, stream: str) -> list[ConsumerState]:
    found: list[ConsumerState] = []
    while True:
        page = await js.consumers_info(stream, offset=len(found))
        found += [ConsumerState(info.name, info.num_pending or 0, info.num_ack_pending or 0) for info in page]
        if len(page) < _PAGE:
            return found


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
            publish_queue_depths(work_queue_depths(await _consumers(js, names.gen_stream), consumer_models)
                                 + token_stream_lags(await _consumers(js, names.tokens_stream), partitions))
        except Exception as exc:
            log.warning("reading the queues' depths failed (%s); the gauges keep their last values", exc)
        await asyncio.sleep(REFRESH_EVERY_S)
