"""Runs Steno's services as processes: for `steno up`, the tests, the fault suite and
the benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from steno.infra.embedded import free_port
from steno.services.common.config import ApiSettings, Settings
from steno.services.common.nats_options import SECURITY_VARIABLES


def remove_namespace(settings: Settings) -> None:
    """Deletes the run's streams and buckets from NATS, so test runs do not pile up."""
    import asyncio

    from steno.services.common.bus import Names, connect
    from steno.services.common.bus import remove_namespace as remove

    async def run() -> None:
        # Bounded: a NATS that is gone for good must not hang the end of a run.
        nc = await connect(settings, "steno-cleanup", max_reconnect_attempts=10)
        try:
            await remove(nc.jetstream(), Names.from_settings(settings))
        finally:
            await nc.close()

    asyncio.run(run())


def service_env(settings: ApiSettings) -> dict[str, str]:
    env = {
        **os.environ,
        "STENO_NATS_URL": settings.nats_url,
        "STENO_DATABASE_URL": settings.database_url,
        "STENO_NAMESPACE": settings.namespace,
        "STENO_STREAM_REPLICAS": str(settings.stream_replicas),
        "STENO_MODEL_WAIT_S": str(settings.model_wait_s),
        "STENO_AUTH": "disabled" if settings.auth_disabled else "required",
        "STENO_RENDER_PROCESSES": str(settings.render_processes),
        "STENO_RENDER_TIMEOUT_S": str(settings.render_timeout_s),
        "STENO_LOG_LEVEL": settings.log_level,
        "STENO_LOG_FORMAT": settings.log_format,
        "STENO_LOG_CONTENT": str(settings.log_content).lower(),
    }
    # Left to each service when not chosen: it takes the deployment's existing count.
    if settings.token_partitions_chosen:
        env["STENO_TOKEN_PARTITIONS"] = str(settings.token_partitions)
    else:
        env.pop("STENO_TOKEN_PARTITIONS", None)
    if settings.otlp_endpoint is None:
        env.pop("STENO_OTLP_ENDPOINT", None)
    else:
        env["STENO_OTLP_ENDPOINT"] = settings.otlp_endpoint
    # The settings' NATS credentials and TLS, not whatever the caller's environment holds.
    for name, variable in SECURITY_VARIABLES.items():
        value = getattr(settings, name)
        if value is None:
            env.pop(variable, None)
        else:
            env[variable] = value
    return env


@dataclass
class ServiceProcess:
    """One ``steno <argv>`` process; its output goes to ``log_path`` (None: inherited)."""

    name: str
    argv: list[str]
    log_path: Path | None = None
    process: subprocess.Popen | None = None
    restarts: int = 0

    def start(self, env: dict[str, str]) -> None:
        command = [sys.executable, "-m", "steno.services.cli", *self.argv]
        if self.log_path is None:
            self.process = subprocess.Popen(command, env=env)
            return
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} has not been started")
        return self.process.pid

    def exited(self) -> int | None:
        return self.process.poll() if self.process else None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def log_text(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")


@dataclass
class Stack:
    settings: ApiSettings
    log_dir: Path
    processes: list[ServiceProcess] = field(default_factory=list)
    api_ports: list[int] = field(default_factory=list)
    # tenant -> API key
    keys: dict[str, str] = field(default_factory=dict)

    def create_key(self, tenant: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "steno.services.cli", "keys", "create", "--tenant", tenant],
            env=service_env(self.settings), capture_output=True, text=True, check=True,
        )
        self.keys[tenant] = done.stdout.strip().splitlines()[-1]
        return self.keys[tenant]

    def headers(self, tenant: str = "a") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_ports[0]}/v1"

    def url_of(self, replica: int) -> str:
        return f"http://127.0.0.1:{self.api_ports[replica]}/v1"

    def add(self, name: str, *argv: str) -> ServiceProcess:
        process = ServiceProcess(name, list(argv), self.log_dir / f"{name}.log")
        process.start(service_env(self.settings))
        self.processes.append(process)
        return process

    def add_api(self, shared_port: int | None = None) -> ServiceProcess:
        """An API process on a port of its own (``url_of``), and also on ``shared_port``
        with the other processes given it."""
        port = free_port()
        self.api_ports.append(port)
        shared = ["--shared-port", str(shared_port)] if shared_port is not None else []
        process = self.add(f"api-{len(self.api_ports) - 1}", "api", *shared, "--port", str(port))
        wait_healthy(f"http://127.0.0.1:{port}", process)
        return process

    def stop(self) -> None:
        for process in self.processes:
            process.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log_text()[-4000:]}" for p in self.processes)


def wait_healthy(url: str, process: ServiceProcess, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.exited() is not None:
            raise RuntimeError(f"{process.name} exited:\n{process.log_text()}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{process.name} did not become healthy:\n{process.log_text()}")
