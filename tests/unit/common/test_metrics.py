"""The pure parts of the metrics: queue depths from consumer states, stream timing."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase

from steno.schemas.events import LoggedEvent
from steno.services.common import metrics
from steno.services.common.metrics import (
    ConsumerState,
    QueueDepth,
    StreamTiming,
    publish_queue_depths,
    token_stream_lags,
    work_queue_depths,
)


def test_work_queue_depth_sums_a_models_queue_and_its_shards() -> None:
    consumers = [ConsumerState("worker-a", 3, 2), ConsumerState("worker-a-affinity-0", 1, 1),
                 ConsumerState("worker-b", 0, 5), ConsumerState("worker-gone", 9, 9)]
    models = {"worker-a": "a", "worker-a-affinity-0": "a", "worker-b": "b"}
    assert work_queue_depths(consumers, models) == [QueueDepth("gen", "a", "", 4, 3), QueueDepth("gen", "b", "", 0, 5)]


def test_token_stream_lag_is_per_partition() -> None:
    consumers = [ConsumerState("parser-p10", 7, 0), ConsumerState("parser-p2", 1, 1), ConsumerState("other", 5, 5)]
    assert token_stream_lags(consumers, {"parser-p2": 2, "parser-p10": 10}) == [
        QueueDepth("tokens", "", "2", 1, 1), QueueDepth("tokens", "", "10", 7, 0)]


def test_published_depths_replace_the_previous_ones() -> None:
    publish_queue_depths([QueueDepth("gen", "old-model", "", 1, 0)])
    publish_queue_depths([QueueDepth("gen", "new-model", "", 2, 1)])
    labels = {"stream": "gen", "model": "new-model", "partition": ""}
    assert REGISTRY.get_sample_value("steno_consumer_pending_messages", labels) == 2
    assert REGISTRY.get_sample_value("steno_consumer_ack_pending_messages", labels) == 1
    assert REGISTRY.get_sample_value("steno_consumer_pending_messages",
                                     {**labels, "model": "old-model"}) is None


def _event(seq: int, type_: str) -> LoggedEvent:
    return LoggedEvent(seq=seq, type=type_, payload="{}")


def test_stream_timing_observes_first_event_and_first_content_once() -> None:
    def counts() -> tuple[float, float]:
        labels = {"model": "timed-model"}
        return (REGISTRY.get_sample_value("steno_response_first_event_seconds_count", labels) or 0,
                REGISTRY.get_sample_value("steno_response_first_content_seconds_count", labels) or 0)

    timing = StreamTiming("timed-model", arrived=0.0)
    timing.sent([_event(0, "response.created"), _event(1, "response.in_progress")])
    assert counts() == (1, 0)
    timing.sent([_event(2, "response.output_item.added"), _event(3, "response.output_text.delta")])
    timing.sent([_event(4, "response.output_text.delta")])
    assert counts() == (1, 1)


def _metric_names() -> set[str]:
    """Every Steno metric defined, by the name it is exposed under (counters with ``_total``)."""
    families = [metric.describe()[0] for metric in vars(metrics).values() if isinstance(metric, MetricWrapperBase)]
    return {f"{family.name}_total" if family.type == "counter" else family.name for family in families}


def test_the_dashboard_and_the_docs_name_only_defined_metrics_and_the_docs_all_of_them() -> None:
    root = Path(__file__).resolve().parents[3]
    defined = _metric_names()
    dashboard = (root / "infra/grafana/steno-dashboard.json").read_text()
    queried = {re.sub(r"_(bucket|count|sum)$", "", name) for name in re.findall(r"steno_[a-z_]+", dashboard)}
    assert queried <= defined
    assert set(re.findall(r"`(steno_[a-z_]+)`", (root / "docs/operations.md").read_text())) == defined
