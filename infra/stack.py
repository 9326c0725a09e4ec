"""``steno up``: the whole stack on one machine, each service its own process.

Finds or starts NATS and Postgres (see ``infra.embedded``), migrates the database,
starts the API (with the SSE edge), the workers (the simulator, or vLLM serving a model
directory) and the parsers, says "ready" once a worker serves the model, restarts any
that die, and on Ctrl-C (or SIGTERM) stops them all and the embedded servers with them."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from nats.js.errors import KeyNotFoundError

from steno.infra.embedded import free_port, resolve
from steno.infra.processes import ServiceProcess, wait_healthy
from steno.services.common import bus
from steno.services.common.config import Settings
from steno.services.common.migrate import ensure_database, upgrade
from steno.services.worker.main import DEFAULT_MODEL, ENGINES, VLLM_INSTALL_HINT, add_model_arguments, model_argv

STOP_TIMEOUT_S = 15.0
# Loading a large model's weights takes minutes; downloading them first, longer.
DEFAULT_READY_TIMEOUT_S = 1800.0
PROGRESS_EVERY_S = 15.0


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(os.environ.get("STENO_DATA_DIR") or Path(base) / "steno")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, default=None, help="where embedded servers keep their data")
    parser.add_argument("--embedded", action="store_true",
                        help="always start embedded NATS and Postgres (on ports of their own)")
    parser.add_argument("--no-auth", action="store_true",
                        help="dev mode: accept requests without an API key (all in one tenant)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080,
                        help="API port; with --api N > 1 every replica listens on it (the kernel spreads the "
                             "connections) and replica i also on port+1+i, its own (health, metrics)")
    parser.add_argument("--api", type=int, default=1, help="API/edge replicas")
    parser.add_argument("--workers", type=int, default=1,
                        help="generation workers (vLLM: one per GPU; worker i gets GPU i when CUDA_VISIBLE_DEVICES "
                        "is not set)")
    parser.add_argument("--parsers", type=int, default=1, help="parser replicas")
    parser.add_argument("--engine", choices=ENGINES, default="simulator",
                        help="vllm: serve the model in --model-path (vLLM must be installed)")
    parser.add_argument("--model", help=f"model name the workers serve (default: {DEFAULT_MODEL}; with --engine "
                        "vllm the model directory's name)")
    parser.add_argument("--ready-timeout-s", type=float, default=DEFAULT_READY_TIMEOUT_S,
                        help="how long to wait for the workers to serve the model (vLLM loads it first)")
    parser.add_argument("--sim-tokens-per-s", type=float, default=200.0)
    parser.add_argument("--sim-first-token-delay-ms", type=float, default=0.0)
    parser.add_argument("--sim-answer-tokens", type=int, default=0,
                        help="output length: each plain-text answer's completion has at least this many tokens")
    parser.add_argument("--sim-dialect", default="harmony",
                        help="the format the simulated model speaks: harmony (gpt-oss), or a chat-template "
                        "family: hermes, llama3, mistral, qwen3, deepseek")
    add_model_arguments(parser)


def served_model(args: argparse.Namespace) -> str:
    """The name clients ask for: --model, else the model directory's name (vLLM)."""
    if args.model:
        return str(args.model)
    if args.engine == "vllm":
        return Path(args.model_path).resolve().name
    return DEFAULT_MODEL


def check_engine(args: argparse.Namespace) -> None:
    """Stops before anything starts when the engine cannot run here."""
    if args.engine != "vllm":
        return
    if not args.model_path:
        raise SystemExit("steno up: --engine vllm needs --model-path DIR (the model's weights, config and tokenizer)")
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit(f"steno up: --engine vllm needs vLLM in this Python environment ({sys.executable}): "
                         f"{VLLM_INSTALL_HINT}")


def worker_argv(args: argparse.Namespace) -> list[str]:
    if args.engine == "vllm":
        return ["worker", "--engine", "vllm", "--model", served_model(args), *model_argv(args)]
    return ["worker", "--model", served_model(args), "--sim-tokens-per-s", str(args.sim_tokens_per_s),
            "--sim-first-token-delay-ms", str(args.sim_first_token_delay_ms), "--sim-dialect", args.sim_dialect,
            "--sim-answer-tokens", str(args.sim_answer_tokens)]


def worker_environments(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Variables of each worker's own, by process name. Several vLLM workers would all
    load onto the first GPU: unless CUDA_VISIBLE_DEVICES says otherwise, worker i gets
    the i-th --tensor-parallel-size GPUs."""
    if args.engine != "vllm" or args.workers == 1 or "CUDA_VISIBLE_DEVICES" in environ:
        return {}
    size = args.tensor_parallel_size
    return {f"worker-{i}": {"CUDA_VISIBLE_DEVICES": ",".join(str(i * size + d) for d in range(size))}
            for i in range(args.workers)}


def example_request(base_url: str, model: str, auth: bool) -> str:
    """A first request to try, for the terminal."""
    key = ' -H "authorization: Bearer $STENO_API_KEY"' if auth else ""
    body = json.dumps({"model": model, "input": "Hello!"})
    return f"curl -s {base_url}/responses -H 'content-type: application/json'{key} -d {shlex.quote(body)}"


async def wait_until_served(settings: Settings, model: str, workers: list[ServiceProcess], timeout_s: float,
                            say: Callable[[str], None], stopping: Callable[[], bool]) -> bool:
    """Waits until a worker has registered ``model`` (what GET /v1/models lists);
    False when told to stop first."""
    nc = await bus.connect(settings, "steno-up", max_reconnect_attempts=10)
    try:
        registry = await bus.worker_registry(nc.jetstream(), bus.Names.from_settings(settings))
        started = time.monotonic()
        next_progress = started + PROGRESS_EVERY_S
        while not stopping():
            try:
                await registry.get(bus.model_token(model))
                return True
            except KeyNotFoundError:
                pass
            for worker in workers:
                code = worker.exited()
                # Ctrl-C in a terminal reaches the workers too: then their exit is no failure.
                if code is not None and not stopping():
                    raise SystemExit(f"steno up: {worker.name} exited with {code} before serving {model} "
                                     "(its output is above)")
            waited = time.monotonic() - started
            if waited > timeout_s:
                raise SystemExit(f"steno up: no worker served {model} within {timeout_s:g} s (--ready-timeout-s)")
            if time.monotonic() >= next_progress:
                say(f"waiting for {model} to load: {waited:.0f} s (at most {timeout_s:g} s)")
                next_progress += PROGRESS_EVERY_S
            await asyncio.sleep(0.5)
        return False
    finally:
        await nc.close()


def _children(args: argparse.Namespace) -> list[ServiceProcess]:
    children = [ServiceProcess(f"api-{i}", api_argv(args.host, args.port, i, args.api)) for i in range(args.api)]
    children += [ServiceProcess(f"worker-{i}", [*worker_argv(args), "--metrics-port", str(free_port())])
                 for i in range(args.workers)]
    children += [ServiceProcess(f"parser-{i}", ["parser", "--metrics-port", str(free_port())])
                 for i in range(args.parsers)]
    return children


def api_argv(host: str, port: int, replica: int, replicas: int) -> list[str]:
    """One API process listens on ``port``; several share it, each with its own port
    after it as well, last in the arguments (where its health and metrics are read)."""
    if replicas == 1:
        return ["api", "--host", host, "--port", str(port)]
    return ["api", "--host", host, "--shared-port", str(port), "--port", str(port + 1 + replica)]


def metrics_urls(host: str, children: list[ServiceProcess]) -> list[str]:
    """Where each service's /metrics is (the API's on its own port)."""
    urls = []
    for child in children:
        port = child.argv[child.argv.index("--metrics-port") + 1] if "--metrics-port" in child.argv else child.argv[-1]
        urls.append(f"{child.name} http://{host}:{port}/metrics")
    return urls


def _stop(children: list[ServiceProcess]) -> None:
    for child in children:
        if child.process is not None and child.exited() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for child in children:
        if child.process is not None:
            child.stop(timeout_s=max(0.1, deadline - time.monotonic()))


def run(args: argparse.Namespace) -> None:
    check_engine(args)
    data_dir = (args.data_dir or default_data_dir()).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    say = lambda line: print(f"steno: {line}", flush=True)  # noqa: E731
    say(f"data directory {data_dir}")
    stopping = False

    def on_signal(_signum, _frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    infra = resolve(data_dir, force_embedded=args.embedded, log_line=say)
    children: list[ServiceProcess] = []
    try:
        say(f"using {infra.describe()}")
        asyncio.run(ensure_database(infra.database_url))
        upgrade(infra.database_url)
        say("database migrated")
        env = {**os.environ, "STENO_NATS_URL": infra.nats_url, "STENO_DATABASE_URL": infra.database_url}
        if args.no_auth:
            env["STENO_AUTH"] = "disabled"
            say("authentication is OFF (--no-auth): any client can use this server")
        else:
            say("authentication is on: create a key with `steno keys create --tenant NAME`"
                f" (STENO_DATABASE_URL={infra.database_url})")
        children = _children(args)
        own_env = worker_environments(args, env)
        for child in children:
            child.start({**env, **own_env.get(child.name, {})})
        base = f"http://{args.host}:{args.port}"
        for child in children[: args.api]:
            wait_healthy(f"http://{args.host}:{child.argv[-1]}", child)
        if args.api > 1:
            say(f"{args.api} API processes share port {args.port}; each also listens on its own: "
                + ", ".join(f"{child.name} {child.argv[-1]}" for child in children[: args.api]))
        say("metrics (with /healthz and /readyz beside them): " + ", ".join(metrics_urls(args.host, children)))
        model = served_model(args)
        if args.engine == "vllm":
            say(f"vLLM is loading {model} from {args.model_path}; ready once it is served")
        served = asyncio.run(wait_until_served(
            Settings(nats_url=infra.nats_url), model, children[args.api: args.api + args.workers],
            args.ready_timeout_s, say, lambda: stopping))
        if served:
            say(f"ready: base URL {base}/v1  (OPENAI_BASE_URL={base}/v1) serving {model}; Ctrl-C stops everything")
            say(f"try: {example_request(base + '/v1', model, auth=not args.no_auth)}")
        while not stopping:
            time.sleep(0.2)
            for child in children:
                code = child.exited()
                if code is not None and not stopping:
                    child.restarts += 1
                    say(f"{child.name} exited with {code}; restarting (restart {child.restarts})")
                    child.start({**env, **own_env.get(child.name, {})})
    finally:
        say("stopping")
        _stop(children)
        infra.stop()
        say("stopped")
