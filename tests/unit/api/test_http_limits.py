"""The connection limits' protocol (services/api/http_limits.py) fed by hand: a transport
that records what is written, an app that reads the whole body and echoes its length."""

import asyncio
import re

import orjson
from uvicorn.config import Config
from uvicorn.server import ServerState

from steno.services.api.http_limits import HttpLimits, limited_protocol

LIMIT = 1024
SHORT_S = 0.05


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.eof_written = False
        self.read_paused = False
        self.protocol: asyncio.BaseProtocol | None = None

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def write(self, data) -> None:
        assert not self.eof_written and not self.closed, "written after the end"
        self.written += data

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.read_paused = True

    def resume_reading(self) -> None:
        self.read_paused = False

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol


class EchoLength:
    def __init__(self) -> None:
        self.received: list[dict] = []
        self.release = asyncio.Event()

    async def __call__(self, scope, receive, send) -> None:
        size = 0
        while True:
            message = await receive()
            self.received.append(message)
            if message["type"] == "http.disconnect":
                return
            size += len(message["body"])
            if not message["more_body"]:
                break
        if scope["path"] == "/hang":
            await self.release.wait()
        body = str(size).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def connection(max_head: int = LIMIT, head_s: float = 10.0, body_s: float = 10.0):
    app = EchoLength()
    config = Config(app=app, lifespan="off", timeout_keep_alive=10)
    config.load()
    protocol_class = limited_protocol(HttpLimits(max_head, head_s, body_s))
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})  # type: ignore[call-arg]
    transport = Transport()
    transport.protocol = protocol
    protocol.connection_made(transport)
    return protocol, transport, app


def request_head(size: int, extra: str = "") -> bytes:
    """A GET head of exactly ``size`` bytes."""
    start = f"GET / HTTP/1.1\r\nHost: x\r\n{extra}X-Fill: "
    return (start + "f" * (size - len(start) - 4) + "\r\n\r\n").encode()


def statuses(transport: Transport) -> list[int]:
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", bytes(transport.written))]


def error_of(transport: Transport) -> dict:
    return orjson.loads(bytes(transport.written).partition(b"\r\n\r\n")[2])["error"]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_head_of_exactly_the_limit_is_served() -> None:
    protocol, transport, _ = connection()
    protocol.data_received(request_head(LIMIT))
    await settle()
    assert statuses(transport) == [200] and not transport.closed


async def test_a_head_one_byte_over_is_431_and_the_connection_ends() -> None:
    protocol, transport, app = connection()
    protocol.data_received(request_head(LIMIT + 1))
    await settle()
    assert statuses(transport) == [431] and transport.eof_written
    assert error_of(transport)["type"] == "invalid_request_error"
    assert app.received == []
    # What the client still sends is dropped, and the connection closes after the linger.
    protocol.data_received(b"x" * 100_000)
    assert statuses(transport) == [431]


async def test_a_huge_head_in_many_reads_stops_at_the_limit() -> None:
    protocol, transport, _ = connection()
    protocol.data_received(b"GET / HTTP/1.1\r\nAuthorization: Bearer ")
    for _ in range(100):
        protocol.data_received(b"k" * 100)
    assert statuses(transport) == [431]
    assert protocol._head_bytes <= LIMIT


async def test_a_body_larger_than_the_limit_in_the_same_read_as_its_head() -> None:
    protocol, transport, _ = connection()
    body = b"b" * (LIMIT * 5 + 7)
    head = f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    protocol.data_received(head + body + request_head(LIMIT))
    await settle()
    assert statuses(transport) == [200, 200]
    assert bytes(transport.written).split(b"\r\n\r\n")[1].startswith(str(len(body)).encode() + b"HTTP/1.1")


async def test_a_pipelined_head_over_the_limit_after_a_body_is_cut_off() -> None:
    protocol, transport, _ = connection()
    body = b"b" * (LIMIT * 3)
    head = f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    protocol.data_received(head + body + b"GET / HTTP/1.1\r\nX-Big: " + b"g" * (LIMIT * 4))
    # Cut off while the POST is still being answered: no answer can go between, so it
    # just closes.
    assert transport.closed and statuses(transport) == []
    assert protocol._head_bytes <= LIMIT
    await settle()


async def test_a_partial_head_times_out_with_408() -> None:
    protocol, transport, _ = connection(head_s=SHORT_S)
    protocol.data_received(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\n")
    await asyncio.sleep(SHORT_S * 3)
    assert statuses(transport) == [408] and transport.eof_written


async def test_a_connection_that_sends_nothing_is_closed_without_an_answer() -> None:
    _, transport, _ = connection(head_s=SHORT_S)
    await asyncio.sleep(SHORT_S * 3)
    assert transport.closed and transport.written == b""


async def test_between_requests_the_head_timer_does_not_run() -> None:
    protocol, transport, _ = connection(head_s=SHORT_S)
    protocol.data_received(request_head(200))
    await asyncio.sleep(SHORT_S * 3)
    assert statuses(transport) == [200] and not transport.closed


async def test_a_stalled_body_times_out_with_408_and_the_app_sees_a_disconnect() -> None:
    protocol, transport, app = connection(body_s=SHORT_S)
    protocol.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
    await asyncio.sleep(SHORT_S * 3)
    assert statuses(transport) == [408] and transport.eof_written
    assert app.received[-1] == {"type": "http.disconnect"}


async def test_a_body_that_keeps_coming_does_not_time_out() -> None:
    protocol, transport, _ = connection(body_s=SHORT_S * 2)
    protocol.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\n")
    for byte in b"12345678":
        await asyncio.sleep(SHORT_S)
        protocol.data_received(bytes([byte]))
    await settle()
    assert statuses(transport) == [200]


async def test_a_body_the_server_is_not_reading_does_not_time_out() -> None:
    protocol, transport, _ = connection(body_s=SHORT_S)
    protocol.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\n1234")
    await settle()
    # As uvicorn pauses reading when the app leaves a body unread.
    protocol.flow.pause_reading()
    await asyncio.sleep(SHORT_S * 3)
    assert transport.written == b""
    protocol.flow.resume_reading()
    protocol.data_received(b"5678")
    await settle()
    assert statuses(transport) == [200]


async def test_a_stalled_pipelined_body_closes_without_an_answer_inside_another() -> None:
    protocol, transport, app = connection(body_s=SHORT_S)
    protocol.data_received(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n"
                           b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
    await asyncio.sleep(SHORT_S * 3)
    assert transport.closed and transport.written == b""
    app.release.set()
    await settle()
