"""The short fault suite: every failure once, a few streams each, nothing lost."""

import asyncio

import pytest

from tests.fault.suite import FAILURES, healthy, run, table

pytestmark = pytest.mark.fault


def test_every_failure_loses_nothing():
    results = asyncio.run(run(FAILURES, trials=1, streams=4, seed=7, tokens_per_s=30.0))
    print(table(results))
    assert set(results) == set(FAILURES)
    assert all(trial.streams == 4 for trials in results.values() for trial in trials)
    problems = [m for trials in results.values() for t in trials for m in t.mismatches]
    assert healthy(results), "\n".join(problems) + "\n" + table(results)
