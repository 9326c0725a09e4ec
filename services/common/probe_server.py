"""``/metrics``, ``/healthz`` and ``/readyz`` for a service without an HTTP API (a
worker, a parser): a small HTTP/1.0 responder on the service's own event loop, one
request per connection, no thread per request."""

from __future__ import annotations

import asyncio
import logging

import orjson

from steno.services.common.health import Readiness
from steno.services.common.metrics import exposition

log = logging.getLogger(__name__)

# A scraper sends its request at once; one that dawdles is dropped.
REQUEST_TIMEOUT_S = 5.0
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
# Request heads beyond this are not a probe's.
_MAX_HEAD_BYTES = 8192


class ProbeServer:
    def __init__(self, readiness: Readiness, host: str, port: int) -> None:
        self._readiness = readiness
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The port it listens on (the one picked, when asked for port 0)."""
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port, limit=_MAX_HEAD_BYTES)
        log.info("metrics and probes on http://%s:%d/metrics, /healthz, /readyz", self._host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            method, _, rest = head.decode("latin-1").partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            status, body, content_type = await self._answer(method, path)
            writer.write(f"HTTP/1.0 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1"))
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, method: str, path: str) -> tuple[int, bytes, str]:
        if method not in ("GET", "HEAD"):
            return 405, b"GET only\n", "text/plain"
        if path == "/metrics":
            body, content_type = exposition()
            return 200, body, content_type
        if path == "/healthz":
            return 200, b'{"status":"alive"}', "application/json"
        if path == "/readyz":
            ready, report = await self._readiness.evaluate()
            return 200 if ready else 503, orjson.dumps(report), "application/json"
        return 404, b"not found: /metrics, /healthz or /readyz\n", "text/plain"


async def serve_probes(port: int | None, readiness: Readiness) -> ProbeServer | None:
    """The probe server on ``port`` (every interface: probes and scrapers come from
    elsewhere), started; None when no port is set."""
    if port is None:
        return None
    server = ProbeServer(readiness, "0.0.0.0", port)
    await server.start()
    return server
