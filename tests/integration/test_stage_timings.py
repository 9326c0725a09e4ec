"""Where a request's time goes: every timed request is seen at every step, in the
order the pipeline takes it, in bursts and in a closed loop. The bus's steps come
through one subscription, in the order the server sent them, and the client's through
one stream, so each keeps its order request by request; the two are compared by their
medians, a whole stage apart."""

from __future__ import annotations

import pytest

from steno.benchmarks.harness import pct
from steno.benchmarks.stage_timings import BURST_STEPS, STEPS, measure, report

pytestmark = pytest.mark.integration


def _per_request(after_send: dict[str, list[float]]) -> list[dict[str, float]]:
    counts = {step: len(values) for step, values in after_send.items()}
    assert len(set(counts.values())) == 1, f"a step missed requests: {counts}"
    return [dict(zip(after_send, times, strict=True)) for times in zip(*after_send.values(), strict=True)]


async def test_a_closed_loop_times_each_request_from_its_own_sending(settings):
    after_send = await measure(4, {}, closed_loop_s=2.0)
    assert tuple(after_send) == STEPS
    requests = _per_request(after_send)
    assert len(requests) >= 8
    for times in requests:
        assert 0 < times["queued"] <= times["batch"] <= times["last batch"] <= times["last announced"]
        assert times["batch"] <= times["announced"] <= times["last announced"]
        assert times["created"] <= times["content"] <= times["done"]
    median = {step: pct(values, .5) for step, values in after_send.items()}
    assert median["batch"] < median["content"]
    printed = report(after_send, "the request")
    assert "ms after the request was sent" in printed
    assert all(f"\n{step:15} " in printed for step in STEPS)


async def test_bursts_time_each_request_from_its_burst(settings):
    after_send = await measure(4, {}, rounds=2)
    assert tuple(after_send) == BURST_STEPS
    requests = _per_request(after_send)
    assert len(requests) == 4 * 2
    for times in requests:
        assert 0 < times["queued"] <= times["batch"] <= times["announced"]
        assert times["created"] <= times["content"]
    median = {step: pct(values, .5) for step, values in after_send.items()}
    assert median["batch"] < median["content"]
