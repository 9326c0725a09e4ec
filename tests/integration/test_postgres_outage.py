"""A Postgres outage longer than a batch's deliveries last: the parser keeps what it
holds and tries it again in place until Postgres answers, so the response finishes
whole once it does, instead of its batches running out of deliveries and the response
waiting for good.

The services reach Postgres through a relay in this process that the test cuts (every
connection closed, new ones refused) and restores; Postgres itself is never stopped."""

import asyncio
import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from steno.services.common.db import asyncpg_dsn
from steno.services.parser.service import MAX_DELIVER, RETRY_DELAY_S
from tests.conftest import SLOW_MODEL, reparses_identically, separate_stack

pytestmark = pytest.mark.integration

# Longer than every delivery of a batch handed back at RETRY_DELAY_S would last.
OUTAGE_S = MAX_DELIVER * RETRY_DELAY_S + 5


class PostgresRelay:
    """Relays TCP connections to Postgres, on a thread and event loop of its own (the
    stack's helpers block the test's), until cut."""

    def __init__(self, database_url: str) -> None:
        parts = urlsplit(asyncpg_dsn(database_url))
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._parts = parts
        self._writers: set[asyncio.StreamWriter] = set()
        self._up = True
        self._loop = asyncio.new_event_loop()
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        netloc = self._parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        return urlunsplit(self._parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(asyncio.start_server(self._relay, sock=self._listener))
        self._loop.run_forever()

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if not self._up:
            client_writer.close()
            return
        server_reader, server_writer = await asyncio.open_connection(*self._target)
        self._writers |= {client_writer, server_writer}

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except OSError:
                pass
            finally:
                writer.close()
                self._writers.discard(writer)

        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

    def cut(self) -> None:
        def close_all() -> None:
            self._up = False
            for writer in list(self._writers):
                writer.close()

        self._loop.call_soon_threadsafe(close_all)

    def restore(self) -> None:
        self._loop.call_soon_threadsafe(setattr, self, "_up", True)

    def close(self) -> None:
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


def test_a_response_generating_through_a_long_postgres_outage_finishes_whole(settings, tmp_path):
    relay = PostgresRelay(settings.database_url)
    relayed = settings.with_changes(database_url=relay.url)
    try:
        with separate_stack(relayed, "pgoutage", tmp_path) as stack:
            stack.add("parser", "parser")
            stack.add("worker", "worker", "--model", SLOW_MODEL, "--sim-tokens-per-s", "25")
            stack.add_api()
            with httpx.Client(base_url=stack.base_url, headers=stack.headers(), timeout=30) as http:
                created = http.post("/responses", json={"model": SLOW_MODEL, "input": "through the outage " * 6,
                                                        "background": True})
                assert created.status_code == 200, created.text
                response_id = created.json()["id"]
                time.sleep(0.5)  # generating: its first batches are being parsed
                relay.cut()
                time.sleep(OUTAGE_S)
                relay.restore()
                deadline = time.monotonic() + 60
                while True:
                    current = http.get(f"/responses/{response_id}")
                    if current.status_code == 200 and current.json()["status"] not in ("queued", "in_progress"):
                        break
                    assert time.monotonic() < deadline, f"still {current.text[:200]} after the outage"
                    time.sleep(0.5)
            final = current.json()
            assert final["status"] == "completed"
            assert final["output"][-1]["content"][0]["text"] == (
                "Steno simulator reply: " + " ".join(("through the outage " * 6).split()))
            assert reparses_identically(settings, response_id)
    finally:
        relay.close()
