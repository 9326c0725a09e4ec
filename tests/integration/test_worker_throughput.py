"""The worker-throughput benchmark against real NATS: what it reports comes from what the
worker really published."""

import argparse

import pytest

from steno.benchmarks.worker_throughput import baseline_publish, bench_engine, steady
from steno.schemas.bus import SamplingParams
from steno.services.dialects import DEFAULT_DIALECT, dialect_named
from steno.services.worker.simulator import SimulatorEngine, SimulatorTiming

pytestmark = pytest.mark.integration


async def test_every_message_the_worker_stored_is_timed_to_its_puback(settings):
    args = argparse.Namespace(nats_url=settings.nats_url, phase_timeout=60.0, batch_interval_ms=5.0)
    simulator = SimulatorEngine(dialect_named(DEFAULT_DIALECT), SimulatorTiming(tokens_per_s=0))
    result = await bench_engine(args, "simulator", simulator, SamplingParams(max_tokens=48), requests=24,
                                concurrency=8)
    assert not result.note
    assert result.tokens > 0 and result.batches >= result.messages > 0
    # The worker's publishes (its batches, groups and ends) and nothing else.
    assert len(result.publish_s) == result.messages
    assert all(seconds > 0 for seconds in result.publish_s)


async def test_the_idle_bus_baseline_times_each_publish(settings):
    samples = await baseline_publish(settings.nats_url, count=20)
    assert len(samples) == 20 and all(seconds > 0 for seconds in samples)


async def test_steady_streams_count_what_the_measured_round_stored(settings):
    # Each prompt's first token (the warm-up round) is stored too, before the clock starts:
    # counted, its ends would make more ends than streams.
    result = await steady(settings.nats_url, streams=6, tokens=40, rate=200.0, batch_interval_s=0.02,
                          timeout_s=60.0)
    assert not result.note
    assert result.ended == 6
    assert result.tokens >= 6 * 40  # every answer padded to at least that many
    assert 0 < result.messages <= result.tokens + 6
    assert result.cpu_s > 0 and result.wall_s >= 40 / 200.0
    assert result.cpu_s_per_1k_tokens == 1000 * result.cpu_s / result.tokens
