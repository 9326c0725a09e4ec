"""``steno up``: the whole stack on one machine, each service its own process.

Finds or starts NATS and Postgres (see ``infra.embedded``), migrates the database,
starts the API (with the SSE edge), the workers and the parsers, restarts any that
die, and on Ctrl-C (or SIGTERM) stops them all and the embedded servers with them."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from pathlib import Path

from steno.infra.embedded import resolve
from steno.infra.processes import ServiceProcess, wait_healthy
from steno.services.common.migrate import ensure_database, upgrade

STOP_TIMEOUT_S = 15.0


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
    parser.add_argument("--port", type=int, default=8080, help="API port (replica i listens on port+i)")
    parser.add_argument("--api", type=int, default=1, help="API/edge replicas")
    parser.add_argument("--workers", type=int, default=1, help="simulator workers")
    parser.add_argument("--parsers", type=int, default=1, help="parser replicas")
    parser.add_argument("--model", default="steno-simulator", help="model name the workers serve")
    parser.add_argument("--sim-tokens-per-s", type=float, default=200.0)
    parser.add_argument("--sim-first-token-delay-ms", type=float, default=0.0)
    parser.add_argument("--sim-dialect", default="harmony",
                        help="the format the simulated model speaks: harmony (gpt-oss), or a chat-template "
                        "family: hermes, llama3, mistral, qwen3, deepseek")


def _children(args: argparse.Namespace) -> list[ServiceProcess]:
    children = [ServiceProcess(f"api-{i}", ["api", "--host", args.host, "--port", str(args.port + i)])
                for i in range(args.api)]
    children += [
        ServiceProcess(f"worker-{i}", ["worker", "--model", args.model, "--sim-tokens-per-s",
                                       str(args.sim_tokens_per_s), "--sim-first-token-delay-ms",
                                       str(args.sim_first_token_delay_ms), "--sim-dialect", args.sim_dialect])
        for i in range(args.workers)
    ]
    children += [ServiceProcess(f"parser-{i}", ["parser"]) for i in range(args.parsers)]
    return children


def _stop(children: list[ServiceProcess]) -> None:
    for child in children:
        if child.process is not None and child.exited() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for child in children:
        if child.process is not None:
            child.stop(timeout_s=max(0.1, deadline - time.monotonic()))


def run(args: argparse.Namespace) -> None:
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
        for child in children:
            child.start(env)
        base = f"http://{args.host}:{args.port}"
        for child in children[: args.api]:
            wait_healthy(f"http://{args.host}:{child.argv[-1]}", child)
        say(f"ready: base URL {base}/v1  (OPENAI_BASE_URL={base}/v1); Ctrl-C stops everything")
        while not stopping:
            time.sleep(0.2)
            for child in children:
                code = child.exited()
                if code is not None and not stopping:
                    child.restarts += 1
                    say(f"{child.name} exited with {code}; restarting (restart {child.restarts})")
                    child.start(env)
    finally:
        say("stopping")
        _stop(children)
        infra.stop()
        say("stopped")
