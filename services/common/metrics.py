"""Every Steno metric, in one place (``prometheus_client``'s default registry).

Labels stay few-valued: a route's template, a status, a model, a stream, a partition;
never a response id or a tenant. Counters and histograms are updated where things
happen; what is a level (free slots, queue depths) is read when scraped
(``set_function``) or refreshed by a background task, so a scrape never waits on NATS
or Postgres. docs/operations.md describes each metric."""

from __future__ import annotations

import time
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass

from nats.js import JetStreamContext
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

from steno.schemas.events import LoggedEvent

# Latencies of the pipeline: a first event within milliseconds, a cold model's first
# token within seconds.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# JetStream lists at most this many consumers per request.
_CONSUMERS_PAGE = 256

# The API.
API_REQUESTS = Counter("steno_api_requests_total", "HTTP requests answered, by route template and status",
                       ["method", "route", "status"])
FIRST_EVENT = Histogram("steno_response_first_event_seconds",
                        "From a streamed response's request arriving to its first event sent", ["model"],
                        buckets=_LATENCY_BUCKETS)
FIRST_CONTENT = Histogram("steno_response_first_content_seconds",
                          "From a streamed response's request arriving to its first content delta sent", ["model"],
                          buckets=_LATENCY_BUCKETS)
CANCELS = Counter("steno_cancels_total", "Cancels of background responses ordered")
CANCEL_LATENCY = Histogram("steno_cancel_seconds", "From a cancel request to the answer it got",
                           buckets=_LATENCY_BUCKETS)
CONSUMER_PENDING = Gauge("steno_consumer_pending_messages",
                         "Messages waiting for a consumer (JetStream num_pending): the work queue's depth per model, "
                         "the parsers' lag per token partition", ["stream", "model", "partition"])
CONSUMER_ACK_PENDING = Gauge("steno_consumer_ack_pending_messages",
                             "Messages delivered and not yet acknowledged (JetStream num_ack_pending)",
                             ["stream", "model", "partition"])

# The SSE edge (inside the API).
EDGE_STREAMS = Gauge("steno_edge_streams", "Event streams open to clients")
EDGE_REPLAY = Histogram("steno_edge_replay_seconds", "Reading a stream's stored events before following it live",
                        buckets=_LATENCY_BUCKETS)

# Workers.
GENERATIONS = Counter("steno_generations_total", "Generation attempts ended, by how they ended",
                      ["model", "finish_reason"])
GENERATED_TOKENS = Counter("steno_generated_tokens_total", "Output tokens published", ["model"])
PROMPT_TOKENS = Counter("steno_prompt_tokens_total", "Prompt tokens of the generation attempts ended", ["model"])
IN_FLIGHT = Gauge("steno_worker_in_flight", "Generations running on this worker", ["model"])
BATCH_WINDOW = Gauge("steno_worker_batch_window_seconds",
                     "The worker's token batch coalescing window: its base interval, or twice that"
                     " while most batches wait for it", ["model"])
FREE_SLOTS = Gauge("steno_worker_free_slots", "Generations this worker may still take on", ["model"])
WORK_REDELIVERED = Counter("steno_work_redelivered_total",
                           "Generation requests taken up again after an earlier delivery (a worker died or gave "
                           "one back)", ["model"])
WORK_EXHAUSTED = Counter("steno_work_exhausted_total",
                         "Generation requests whose every delivery ended with its worker stopped (died, frozen or "
                         "crashed by the request), failed visibly", ["model"])
WORK_UNQUEUED = Counter("steno_work_unqueued_total",
                        "Responses stored whose work never reached the queue (the API process that stored them "
                        "stopped first), found by the API's queue checks and failed visibly", ["model"])

# Parsers.
TOKENS_GIVEN_UP = Counter("steno_parser_given_up_total",
                          "Responses failed visibly at a token message's last delivery, every parser it reached "
                          "before having stopped with it unsettled (crashed by it, maybe); it is not parsed",
                          ["model"])
PARSED_EVENTS = Counter("steno_events_total", "Response events committed to the log", ["model"])
COMMIT_LATENCY = Histogram("steno_parser_commit_seconds", "One commit statement of the event log",
                           buckets=_COMMIT_BUCKETS)
COMMIT_BATCH = Histogram("steno_parser_commit_responses", "Responses written by one commit statement",
                         buckets=_BATCH_BUCKETS)

# Leases (parsers' token partitions, workers' affinity shards).
PARTITIONS_TAKEN_OVER = Counter("steno_partitions_taken_over_total",
                                "Partitions acquired after this holder's first lease round: handed on by another "
                                "holder (rebalancing, a clean stop) or left by one that stopped renewing", ["holder"])

# Where a request arrived, for the latencies measured from it (set by the API's
# middleware; a ContextVar reaches the route's task without being passed along).
_REQUEST_ARRIVED: ContextVar[float | None] = ContextVar("steno_request_arrived", default=None)


def mark_request_arrived() -> None:
    _REQUEST_ARRIVED.set(time.perf_counter())


def request_arrived() -> float:
    """When the current request arrived; now when none is being served."""
    arrived = _REQUEST_ARRIVED.get()
    return time.perf_counter() if arrived is None else arrived


def exposition() -> tuple[bytes, str]:
    """The registry in Prometheus' text format, and its content type."""
    return generate_latest(), CONTENT_TYPE_LATEST


class StreamTiming:
    """Times a streamed response's first event and first content delta, once each."""

    __slots__ = ("_arrived", "_first_content", "_first_event", "_waiting_content", "_waiting_event")

    def __init__(self, model: str, arrived: float) -> None:
        self._arrived = arrived
        self._first_event = FIRST_EVENT.labels(model)
        self._first_content = FIRST_CONTENT.labels(model)
        self._waiting_event = True
        self._waiting_content = True

    def sent(self, run: list[LoggedEvent]) -> None:
        if self._waiting_event:
            self._waiting_event = False
            self._first_event.observe(time.perf_counter() - self._arrived)
        if self._waiting_content and any(event.type.endswith(".delta") for event in run):
            self._waiting_content = False
            self._first_content.observe(time.perf_counter() - self._arrived)


@dataclass(frozen=True)
class ConsumerState:
    """What JetStream says of one durable consumer."""

    name: str
    pending: int
    ack_pending: int


@dataclass(frozen=True)
class QueueDepth:
    stream: str
    model: str
    partition: str
    pending: int
    ack_pending: int


async def consumer_states(js: JetStreamContext, stream: str) -> list[ConsumerState]:
    """Every durable consumer of ``stream``, in one JetStream request per page of them."""
    found: list[ConsumerState] = []
    while True:
        page = await js.consumers_info(stream, offset=len(found))
        found += [ConsumerState(info.name, info.num_pending or 0, info.num_ack_pending or 0) for info in page]
        if len(page) < _CONSUMERS_PAGE:
            return found


def work_queue_depths(consumers: Iterable[ConsumerState], consumer_models: dict[str, str]) -> list[QueueDepth]:
    """The work stream's consumers summed per model (its shared queue and its affinity
    shards); ``consumer_models``: each consumer name of a served model -> the model."""
    totals: dict[str, tuple[int, int]] = {}
    for consumer in consumers:
        model = consumer_models.get(consumer.name)
        if model is None:
            continue
        pending, ack_pending = totals.get(model, (0, 0))
        totals[model] = (pending + consumer.pending, ack_pending + consumer.ack_pending)
    return [QueueDepth("gen", model, "", pending, ack) for model, (pending, ack) in sorted(totals.items())]


def token_stream_lags(consumers: Iterable[ConsumerState], partition_consumers: dict[str, int]) -> list[QueueDepth]:
    """The parsers' consumers, one per token partition; ``partition_consumers``: each
    parser consumer name -> its partition."""
    return sorted((QueueDepth("tokens", "", str(partition_consumers[c.name]), c.pending, c.ack_pending)
                   for c in consumers if c.name in partition_consumers), key=lambda depth: int(depth.partition))


def publish_queue_depths(depths: list[QueueDepth]) -> None:
    """Replaces the queue gauges' values, so a model no longer served drops out."""
    CONSUMER_PENDING.clear()
    CONSUMER_ACK_PENDING.clear()
    for depth in depths:
        CONSUMER_PENDING.labels(depth.stream, depth.model, depth.partition).set(depth.pending)
        CONSUMER_ACK_PENDING.labels(depth.stream, depth.model, depth.partition).set(depth.ack_pending)
