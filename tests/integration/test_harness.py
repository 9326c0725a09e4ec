"""What a benchmark run records of the servers it ran on."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import asyncpg
import pytest

from steno.benchmarks.harness import STORAGE_MIN_EVENTS, Bench
from steno.services.common import bus
from steno.services.common.migrate import drop_database, ensure_database

pytestmark = pytest.mark.integration


async def test_a_run_names_the_nats_and_postgres_versions_it_uses(tmp_path, settings):
    bench = Bench(tmp_path)
    await ensure_database(bench.database_url)
    try:
        versions = await bench.server_versions()
        nc = await bus.connect(bench.settings, "steno-test")
        reported = nc._server_info["version"]
        await nc.close()
        conn = await asyncpg.connect(bench.database_url)
        server_version_num = await conn.fetchval("SHOW server_version_num")
        await conn.close()
    finally:
        await drop_database(bench.database_url)
        bench.infra.stop()
    assert re.fullmatch(r"\d+\.\d+\.\d+", versions["nats"])
    assert reported.startswith(versions["nats"])
    assert int(versions["postgres"].split(".")[0]) == int(server_version_num) // 10000


def test_the_storage_scenario_alone_stores_what_it_measures(tmp_path, settings):
    """Run by itself, no other scenario has stored anything: it makes its own streams
    first, and reports the bytes of real events, as rows and compacted."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "steno.services.cli", "bench", "--scenarios", "storage",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    storage = results["storage"]
    assert storage["events"] >= STORAGE_MIN_EVENTS
    assert storage["events_compacted"] >= storage["events"]
    assert 0 < storage["bytes_per_event_compacted"] < storage["bytes_per_event"]
    assert storage["avg_payload_bytes"] > 0
    assert set(results["machine"]["servers"]) == {"nats", "postgres"}
    assert f"servers: NATS {results['machine']['servers']['nats']}" in done.stdout


def test_the_parser_scenario_reads_a_chat_template_model_s_output(tmp_path, settings):
    """The family's files reach the parser through the bus, as a worker's would, and
    every response it parses completes. ``--token-partitions`` sets the stack's count:
    its parser holds exactly those partitions, and the results say how many."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    done = subprocess.run([sys.executable, "-m", "steno.services.cli", "bench", "--scenarios", "parser",
                           "--parser-family", "qwen3", "--parser-responses", "20", "--token-partitions", "3",
                           "--out", str(out), "--logs", str(logs)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    parser = results["parser"]
    assert parser["dialect"] == "qwen3" and parser["responses"] == 20
    assert parser["tokens"] > 20 * 100 and parser["tokens_per_cpu_second"] > 0
    assert results["token_partitions"] == 3
    acquired = re.findall(r"acquired partition p(\d+)", (logs / "parser.log").read_text())
    assert set(map(int, acquired)) == {0, 1, 2}


def test_a_profiled_run_says_where_each_service_s_time_went(tmp_path, settings):
    """``--profile``: py-spy samples Steno's serving processes while Steno's side of a
    scenario runs, at the rate ``--profile-rate`` asks; the samples are kept and summed
    up per process."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "steno.services.cli", "bench", "--scenarios", "throughput",
                           "--throughput-levels", "4", "--seconds", "3", "--profile", "--profile-rate", "250",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["profile_samples_per_s"] == 250
    profiles = results["profiles"]["throughput-4"]
    assert set(profiles) == {"api-0", "parser", "worker"}
    for name, profile in profiles.items():
        assert profile["samples"] > 0, (name, profile)
        assert (out / "profiles" / "throughput-4" / f"{name}.txt").stat().st_size > 0
    on_stack = dict(profiles["parser"]["on_stack"])
    assert any("services/parser/service.py" in function for function in on_stack), on_stack
    assert any("services/api/responses.py" in function for function, _ in profiles["api-0"]["on_stack"])
    assert "profile throughput-4:" in done.stdout and "  parser: " in done.stdout


def test_a_run_counts_what_the_bus_and_the_database_did_per_request(tmp_path, settings):
    """Every ttfe and throughput level says what Steno's requests cost the servers: each
    request one work message and one stored response, its tokens in batches on the
    token stream, each response's log events and token batches, and the WAL written."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "steno.services.cli", "bench", "--scenarios", "ttfe,throughput",
                           "--ttfe-levels", "4", "--ttfe-samples", "12", "--throughput-levels", "2",
                           "--seconds", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((out / "results.json").read_text())
    for work in (results["ttfe"]["4"]["steno"]["work_per_request"],
                 results["throughput"]["2"]["steno"]["work_per_request"]):
        assert work["nats_messages"]["gen"] == 1.0, work
        assert work["responses"] == 1.0, work
        assert 0 < work["nats_messages"]["tokens"] <= work["token_batches_per_response"], work
        # created, in progress, the output's items and deltas, completed
        assert work["events_per_response"] >= 8, work
        assert work["wal_bytes"] > 1000, work
    assert done.stdout.count("per response: token batches") == 2
