"""``steno up``: the whole stack on one machine, each service its own process.

Finds or starts NATS and Postgres (see ``infra.embedded``), migrates the database,
starts the API (with the SSE edge), the workers and the parsers, restarts any that
die, and on Ctrl-C (or SIGTERM) stops them all and the embedded servers with them."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from infra.embedded import resolve
from services.common.migrate import ensure_database, upgrade

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


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen | None = None
    restarts: int = 0

    def start(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(self.argv, env=env)

    def exited(self) -> int | None:
        return self.process.poll() if self.process else None


def _steno(*args: str) -> list[str]:
    return [sys.executable, "-m", "services.cli", *args]


def _children(args: argparse.Namespace) -> list[Child]:
    children = [Child(f"api-{i}", _steno("api", "--host", args.host, "--port", str(args.port + i)))
                for i in range(args.api)]
    children += [
        Child(f"worker-{i}", _steno("worker", "--model", args.model, "--sim-tokens-per-s", str(args.sim_tokens_per_s),
                                    "--sim-first-token-delay-ms", str(args.sim_first_token_delay_ms)))
        for i in range(args.workers)
    ]
    children += [Child(f"parser-{i}", _steno("parser")) for i in range(args.parsers)]
    return children


def _wait_healthy(url: str, children: list[Child], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in children:
            if child.exited() is not None:
                raise RuntimeError(f"{child.name} exited with {child.exited()} while starting")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the API did not answer at {url} within {timeout_s:.0f}s")


def _stop(children: list[Child]) -> None:
    for child in children:
        if child.exited() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for child in children:
        if child.process is None:
            continue
        try:
            child.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()


def run(args: argparse.Namespace) -> None:
    data_dir = (args.data_dir or default_data_dir()).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    say = lambda line: print(f"steno: {line}", flush=True)  # noqa: E731
    say(f"data directory {data_dir}")
    stopping = False

    def on_signal(signum, _frame) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    infra = resolve(data_dir, force_embedded=args.embedded, log_line=say)
    children: list[Child] = []
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
        _wait_healthy(base, children)
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
