"""py-spy sampling real processes for ``steno bench --profile``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from steno.benchmarks.profiles import Profiler

pytestmark = pytest.mark.integration

SPINNING = textwrap.dedent("""
    import time

    def spin_here(until):
        while time.monotonic() < until:
            pass

    spin_here(time.monotonic() + 30)
""")


async def test_a_busy_process_s_time_is_found_in_the_function_it_spends_it_in(tmp_path):
    spinner = subprocess.Popen([sys.executable, "-c", SPINNING])
    try:
        profiler = Profiler(tmp_path, samples_per_s=200)
        async with profiler.profiling("spin-1", {"spinner": spinner.pid}):
            await asyncio.sleep(1.5)
    finally:
        spinner.kill()
        spinner.wait()
    summary = profiler.results["spin-1"]["spinner"]
    assert summary["samples"] > 100
    function, share = summary["own"][0]
    assert function.startswith("spin_here (") and share > 0.8
    assert (tmp_path / "spin-1" / "spinner.txt").exists()


async def test_a_process_that_cannot_be_sampled_is_reported_not_skipped(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    profiler = Profiler(tmp_path)
    async with profiler.profiling("gone-1", {"gone": gone.pid}):
        pass
    error = profiler.results["gone-1"]["gone"]["error"]
    assert error.startswith("py-spy wrote no samples: ") and len(error) > len("py-spy wrote no samples: ")
