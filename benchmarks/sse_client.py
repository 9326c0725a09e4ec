"""A minimal HTTP/1.1 client for streamed POSTs, the load generator of ``steno bench``.

On a small machine the load generator shares the CPU with what it measures: httpx spent
more CPU per stream than any single Steno service (docs/performance.md), and that
contention landed on whichever side had more processes to schedule. This client does only what the
benchmark needs (keep-alive connections, a JSON body, a chunked ``text/event-stream``
reply) and timestamps each SSE frame as it arrives."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson


class HttpError(Exception):
    """The request failed: a status other than 200, or the connection broke."""


@dataclass
class StreamedReply:
    """The ``data:`` payloads of an SSE reply, each with its arrival time (perf_counter)."""

    frames: list[tuple[float, bytes]] = field(default_factory=list)


class SseClient:
    """Up to ``connections`` keep-alive connections to one origin, reused across requests."""

    def __init__(self, base_url: str, connections: int) -> None:
        parts = urlsplit(base_url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._slots = asyncio.Semaphore(connections)

    async def __aenter__(self) -> SseClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()

    async def post_stream(self, path: str, body: dict) -> StreamedReply:
        payload = orjson.dumps(body)
        head = (f"POST {path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
        async with self._slots:
            reader, writer = self._idle.pop() if self._idle else await asyncio.open_connection(self._host, self._port)
            try:
                writer.write(head + payload)
                reply, reusable = await _read_reply(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                writer.close()
                raise HttpError(type(exc).__name__) from exc
            except BaseException:
                writer.close()
                raise
            if reusable:
                self._idle.append((reader, writer))
            else:
                writer.close()
            return reply


async def _read_reply(reader: asyncio.StreamReader) -> tuple[StreamedReply, bool]:
    status_line = await reader.readuntil(b"\r\n")
    status = int(status_line.split(b" ", 2)[1])
    headers: dict[bytes, bytes] = {}
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip().lower()
    reusable = headers.get(b"connection") != b"close"
    if headers.get(b"transfer-encoding") == b"chunked":
        body = _chunks(reader)
    else:
        body = _sized(reader, int(headers.get(b"content-length", b"0")))
    reply = StreamedReply()
    pending = b""
    async for chunk in body:
        arrived = time.perf_counter()
        pending += chunk
        *complete, pending = pending.split(b"\n\n")
        for event in complete:
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    reply.frames.append((arrived, line[6:]))
    if status != 200:
        raise HttpError(f"HTTPStatusError {status}")
    return reply, reusable


async def _chunks(reader: asyncio.StreamReader):
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


async def _sized(reader: asyncio.StreamReader, length: int):
    if length:
        yield await reader.readexactly(length)
