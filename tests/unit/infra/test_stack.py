"""``steno up``'s choices before anything starts (the engine, the model, each worker's
command line and GPUs), and its wait until the model is served (on real NATS)."""

import argparse
import json
import shlex
import sys
from pathlib import Path

import pytest

from steno.infra import stack as steno_up
from steno.infra.processes import ServiceProcess, service_env
from steno.services.worker import main as worker_main


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    steno_up.add_arguments(parser)
    return parser.parse_args(argv)


def as_worker(argv: list[str]) -> argparse.Namespace:
    """``argv`` read as ``steno worker`` reads it."""
    assert argv[0] == "worker"
    parser = argparse.ArgumentParser()
    worker_main.add_arguments(parser)
    return parser.parse_args(argv[1:])


def test_vllm_without_a_model_path_is_refused_naming_it_before_anything_starts(tmp_path):
    with pytest.raises(SystemExit) as exited:
        steno_up.run(parsed("--engine", "vllm", "--data-dir", str(tmp_path / "data")))
    assert "--model-path" in str(exited.value)
    assert not (tmp_path / "data").exists()


def test_without_vllm_installed_the_message_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what an environment without vLLM looks like to an import
    with pytest.raises(SystemExit) as exited:
        steno_up.run(parsed("--engine", "vllm", "--model-path", str(tmp_path), "--data-dir", str(tmp_path / "data")))
    message = str(exited.value)
    assert "pip install vllm" in message and "infra/vllm-env" in message
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("model_path", ["/models/Qwen3-8B", "/models/Qwen3-8B/", "openai/Qwen3-8B"])
def test_the_model_name_defaults_to_the_model_directorys_name(model_path):
    assert steno_up.served_model(parsed("--engine", "vllm", "--model-path", model_path)) == "Qwen3-8B"


def test_a_model_name_given_wins_and_the_simulator_keeps_its_own():
    assert steno_up.served_model(parsed("--engine", "vllm", "--model-path", "/models/x", "--model", "mine")) == "mine"
    assert steno_up.served_model(parsed()) == "steno-simulator"


def test_the_worker_gets_the_vllm_and_model_flags_given():
    argv = steno_up.worker_argv(parsed(
        "--engine", "vllm", "--model-path", "/models/coder", "--dtype", "bfloat16", "--max-model-len", "2048",
        "--enforce-eager", "--kv-cache-memory-bytes", "268435456", "--tensor-parallel-size", "2",
        "--chat-family", "qwen3", "--tool-call-parser", "qwen3_coder", "--chat-template", "/t/my.jinja",
    ))
    worker = as_worker(argv)
    assert (worker.engine, worker.model, worker.model_path) == ("vllm", "coder", "/models/coder")
    assert (worker.dtype, worker.max_model_len, worker.enforce_eager) == ("bfloat16", 2048, True)
    assert (worker.kv_cache_memory_bytes, worker.tensor_parallel_size) == (268435456, 2)
    assert (worker.chat_family, worker.tool_call_parser, worker.chat_template) == (
        "qwen3", "qwen3_coder", Path("/t/my.jinja"))


def test_flags_left_at_their_defaults_are_left_to_the_worker():
    argv = steno_up.worker_argv(parsed("--engine", "vllm", "--model-path", "/models/m"))
    assert argv == ["worker", "--engine", "vllm", "--model", "m", "--model-path", "/models/m"]


def test_a_simulator_worker_gets_no_vllm_flags():
    worker = as_worker(steno_up.worker_argv(parsed("--sim-dialect", "qwen3", "--dtype", "bfloat16")))
    assert (worker.engine, worker.model, worker.sim_dialect) == ("simulator", "steno-simulator", "qwen3")
    assert worker.dtype == "auto"


def test_a_simulator_worker_gets_the_output_length():
    worker = as_worker(steno_up.worker_argv(parsed("--sim-answer-tokens", "1000", "--sim-tokens-per-s", "50")))
    assert (worker.sim_answer_tokens, worker.sim_tokens_per_s) == (1000, 50.0)


def test_several_vllm_workers_get_a_gpu_each():
    args = parsed("--engine", "vllm", "--model-path", "/models/m", "--workers", "3")
    assert steno_up.worker_environments(args, {}) == {
        "worker-0": {"CUDA_VISIBLE_DEVICES": "0"},
        "worker-1": {"CUDA_VISIBLE_DEVICES": "1"},
        "worker-2": {"CUDA_VISIBLE_DEVICES": "2"},
    }


def test_tensor_parallel_workers_get_that_many_gpus_each():
    args = parsed("--engine", "vllm", "--model-path", "/models/m", "--workers", "2", "--tensor-parallel-size", "2")
    assert steno_up.worker_environments(args, {}) == {
        "worker-0": {"CUDA_VISIBLE_DEVICES": "0,1"},
        "worker-1": {"CUDA_VISIBLE_DEVICES": "2,3"},
    }


@pytest.mark.parametrize(("argv", "environ"), [
    (["--engine", "vllm", "--model-path", "/models/m", "--workers", "2"], {"CUDA_VISIBLE_DEVICES": "4,5"}),
    (["--engine", "vllm", "--model-path", "/models/m"], {}),
    (["--workers", "2"], {}),
], ids=["devices-chosen", "one-worker", "simulator"])
def test_devices_chosen_by_the_user_one_worker_or_the_simulator_are_left_alone(argv, environ):
    assert steno_up.worker_environments(parsed(*argv), environ) == {}


@pytest.mark.parametrize("auth", [False, True])
def test_the_example_request_is_one_shell_command_for_the_model(auth):
    words = shlex.split(steno_up.example_request("http://127.0.0.1:8080/v1", "it's-a-model", auth=auth))
    assert words[:3] == ["curl", "-s", "http://127.0.0.1:8080/v1/responses"]
    assert json.loads(words[words.index("-d") + 1]) == {"model": "it's-a-model", "input": "Hello!"}
    assert ("authorization: Bearer $STENO_API_KEY" in words) is auth


@pytest.mark.integration
async def test_ready_once_a_worker_serves_the_model(settings, tmp_path):
    worker = ServiceProcess("worker-0", ["worker", "--model", "up-ready"], tmp_path / "worker.log")
    worker.start(service_env(settings))
    try:
        assert await steno_up.wait_until_served(settings, "up-ready", [worker], 60, print, lambda: False)
    finally:
        worker.stop()


@pytest.mark.integration
async def test_no_model_in_time_is_an_error_naming_the_bound_after_progress_lines(settings, monkeypatch):
    monkeypatch.setattr(steno_up, "PROGRESS_EVERY_S", 0.2)
    said: list[str] = []
    with pytest.raises(SystemExit) as exited:
        await steno_up.wait_until_served(settings, "nobody-serves-this", [], 2, said.append, lambda: False)
    assert "nobody-serves-this" in str(exited.value) and "--ready-timeout-s" in str(exited.value)
    assert said and all(line.startswith("waiting for nobody-serves-this to load") for line in said)


@pytest.mark.integration
async def test_a_worker_that_dies_before_serving_ends_the_wait_naming_it(settings, tmp_path):
    # No model in the directory (and, outside infra/vllm-env, no vLLM): the worker exits.
    worker = ServiceProcess("worker-0", ["worker", "--engine", "vllm", "--model", "broken",
                                         "--model-path", str(tmp_path)], tmp_path / "worker.log")
    worker.start(service_env(settings))
    try:
        with pytest.raises(SystemExit) as exited:
            await steno_up.wait_until_served(settings, "broken", [worker], 300, lambda line: None, lambda: False)
    finally:
        worker.stop()
    assert "worker-0 exited with" in str(exited.value), worker.log_text()
    assert "before serving broken" in str(exited.value)


@pytest.mark.integration
async def test_ctrl_c_while_waiting_ends_the_wait_without_an_error(settings):
    assert not await steno_up.wait_until_served(settings, "nobody-serves-this", [], 30, print, lambda: True)
