"""The short fault suite: every failure once, a few streams each, nothing lost, and no
work taken from a live process while the machine is starved of CPU. Pauses are
reported, never asserted: their figures belong in the benchmark run (docs/performance.md)."""

import asyncio

import pytest

from tests.fault.suite import FAILURES, NOTHING_DIES, healthy, run, table

pytestmark = pytest.mark.fault


def test_every_failure_loses_nothing():
    results = asyncio.run(run(FAILURES, trials=1, streams=4, seed=7, tokens_per_s=30.0))
    print(table(results))
    assert set(results) == set(FAILURES)
    assert all(trial.streams == 4 for trials in results.values() for trial in trials)
    problems = [m for trials in results.values() for t in trials for m in t.mismatches]
    assert healthy(results), "\n".join(problems) + "\n" + table(results)
    assert [t.takeovers for failure in NOTHING_DIES for t in results[failure]] == [0] * len(NOTHING_DIES), \
        table(results)
