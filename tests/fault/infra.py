"""NATS (one server or a 3-node JetStream cluster) and Postgres that a fault run owns
and can kill or restart, all on loopback under one directory."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pgserver
from pgserver._commands import pg_ctl

from steno.infra.embedded import answers, free_port, nats_server_binary


class NatsNode:
    def __init__(self, data_dir: Path, name: str, port: int, cluster_port: int | None, routes: list[int],
                 jetstream: bool = True) -> None:
        """``jetstream=False``: core NATS alone, as a server whose JetStream is not up yet."""
        self.data_dir, self.name, self.port = data_dir, name, port
        self.argv = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "--server_name", name]
        if jetstream:
            self.argv += ["-js", "-sd", str(data_dir / name)]
        if cluster_port is not None:
            self.argv += ["--cluster_name", "steno", "--cluster", f"nats://127.0.0.1:{cluster_port}",
                          "--routes", ",".join(f"nats://127.0.0.1:{p}" for p in routes)]
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.data_dir / f"{self.name}.log", "ab") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while not answers("127.0.0.1", self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nats node {self.name} did not start")
            time.sleep(0.05)

    def stop(self, kill: bool = False) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill() if kill else self.process.terminate()
            self.process.wait(15)


class Nats:
    """One node, or three clustered (streams replicated 3 ways)."""

    def __init__(self, data_dir: Path, nodes: int = 1) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        ports = [free_port() for _ in range(nodes)]
        cluster_ports = [free_port() for _ in range(nodes)] if nodes > 1 else [None]
        self.nodes = [
            NatsNode(data_dir, f"n{i}", ports[i], cluster_ports[i] if nodes > 1 else None,
                     [p for j, p in enumerate(cluster_ports) if j != i] if nodes > 1 else [])
            for i in range(nodes)
        ]
        for node in self.nodes:
            node.start()
        self.url = ",".join(f"nats://127.0.0.1:{node.port}" for node in self.nodes)
        self.replicas = 3 if nodes >= 3 else 1
        if nodes > 1:
            time.sleep(3)  # let the cluster elect its JetStream meta leader

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class Postgres:
    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.server = pgserver.get_server(data_dir / "postgres", cleanup_mode="stop")

    def url(self, database: str) -> str:
        return self.server.get_uri(database)

    def stop(self) -> None:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.server.pgdata, user=self.server.system_user)

    def start(self) -> None:
        self.server.ensure_postgres_running()

    def close(self) -> None:
        self.server.cleanup()
