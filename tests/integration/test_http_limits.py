"""What one connection may make the API hold (services/api/http_limits.py), over raw
sockets against an API process of the test's own with short limits."""

import socket
import time

import orjson
import pytest

from steno.infra.embedded import free_port
from steno.infra.processes import ServiceProcess, service_env, wait_healthy

pytestmark = pytest.mark.integration

MAX_HEAD = 4096
HEAD_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
KEEP_ALIVE_S = 3.0
# Every wait for the server is bounded by this much beyond what it should take.
SLACK_S = 4.0


@pytest.fixture(scope="module")
def api(stack, tmp_path_factory):
    port = free_port()
    process = ServiceProcess("api-limits", ["api", "--port", str(port), "--keep-alive-s", str(KEEP_ALIVE_S)],
                             tmp_path_factory.mktemp("limits") / "api-limits.log")
    process.start({**service_env(stack.settings), "STENO_MAX_HEADER_BYTES": str(MAX_HEAD),
                   "STENO_HEADER_TIMEOUT_S": str(HEAD_TIMEOUT_S), "STENO_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S)})
    try:
        wait_healthy(f"http://127.0.0.1:{port}", process)
        yield port
    finally:
        process.stop()
        print(process.log_text()[-4000:])


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=SLACK_S)
    sock.settimeout(HEAD_TIMEOUT_S + BODY_TIMEOUT_S + KEEP_ALIVE_S + SLACK_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset counts as closing)."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response with a Content-Length, leaving the connection open."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response head: {data!r}"
        data += chunk
    return parse(data, sock)


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers


def parse(data: bytes, sock: socket.socket | None = None) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    status, headers = parse_head(head)
    length = int(headers["content-length"])
    while sock is not None and len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed inside a response body"
        body += chunk
    assert len(body) == length
    return status, headers, body


def head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def assert_openai_error(body: bytes) -> None:
    error = orjson.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["message"]


def test_oversized_head_gets_431_and_the_connection_closes(api):
    with connect(api) as sock:
        sock.sendall(head("POST", "/v1/responses", {"Authorization": "Bearer " + "k" * 1_000_000}))
        status, headers, body = parse(read_until_closed(sock))
    assert status == 431
    assert headers["connection"] == "close"
    assert_openai_error(body)


def test_a_head_within_the_limit_is_served(api):
    with connect(api) as sock:
        sock.sendall(head("GET", "/health", {"X-Filler": "f" * (MAX_HEAD - 200)}))
        status, _, _ = read_response(sock)
    assert status == 200


def test_a_connection_that_sends_nothing_is_closed(api):
    with connect(api) as sock:
        started = time.monotonic()
        assert read_until_closed(sock) == b""
        assert HEAD_TIMEOUT_S * 0.8 <= time.monotonic() - started < HEAD_TIMEOUT_S + SLACK_S


def test_a_partial_head_is_answered_408_and_closed(api):
    with connect(api) as sock:
        sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        status, _, body = parse(read_until_closed(sock))
        assert time.monotonic() - started < HEAD_TIMEOUT_S + SLACK_S
    assert status == 408
    assert_openai_error(body)


def test_a_head_trickling_in_is_cut_off_at_the_head_timeout(api):
    """The timeout is for the whole head, not between its bytes."""
    with connect(api) as sock:
        started = time.monotonic()
        try:
            for byte in b"GET /health HTTP/1.1\r\nX-Slow: " + b"s" * 1000:
                sock.sendall(bytes([byte]))
                time.sleep(0.1)
                assert time.monotonic() - started < HEAD_TIMEOUT_S + SLACK_S, "still open"
        except (BrokenPipeError, ConnectionResetError):
            pass
        read_until_closed(sock)
        assert time.monotonic() - started < HEAD_TIMEOUT_S + SLACK_S


def test_a_stalled_body_is_answered_408_and_closed(stack, api):
    with connect(api) as sock:
        sock.sendall(head("POST", "/v1/responses", {**stack.headers(), "Content-Type": "application/json",
                                                    "Content-Length": "100"}) + b'{"model": "steno-simulator", ')
        started = time.monotonic()
        status, headers, body = parse(read_until_closed(sock))
        assert BODY_TIMEOUT_S * 0.8 <= time.monotonic() - started < BODY_TIMEOUT_S + SLACK_S
    assert status == 408
    assert headers["connection"] == "close"
    assert_openai_error(body)


def test_a_slow_but_steady_body_is_served(stack, api):
    """Longer in all than the body timeout, bigger than the head limit, one pause under it."""
    body = orjson.dumps({"model": "steno-simulator", "input": "slowly " * 3000})
    pieces = [body[i:i + len(body) // 9 + 1] for i in range(0, len(body), len(body) // 9 + 1)]
    with connect(api) as sock:
        started = time.monotonic()
        sock.sendall(head("POST", "/v1/responses", {**stack.headers(), "Content-Type": "application/json",
                                                    "Content-Length": str(len(body))}))
        for piece in pieces:
            time.sleep(BODY_TIMEOUT_S / 3)
            sock.sendall(piece)
        assert time.monotonic() - started > BODY_TIMEOUT_S * 2
        status, _, answer = read_response(sock)
    assert status == 200, answer
    assert orjson.loads(answer)["status"] == "completed"


def read_statuses(sock: socket.socket, count: int) -> list[int]:
    """The statuses of the next ``count`` responses, however their bytes arrive (several
    pipelined responses can come in one read)."""
    data, statuses = b"", []
    while len(statuses) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            status, headers = parse_head(data[:head_end])
            end = head_end + 4 + int(headers["content-length"])
            if len(data) >= end:
                statuses.append(status)
                data = data[end:]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"closed after {len(statuses)} responses"
        data += chunk
    return statuses


def test_pipelined_requests_are_served(api):
    with connect(api) as sock:
        sock.sendall(head("GET", "/health", {}) * 3)
        assert read_statuses(sock, 3) == [200, 200, 200]


def test_an_idle_keep_alive_connection_lasts_its_own_timeout(api):
    with connect(api) as sock:
        sock.sendall(head("GET", "/health", {}))
        assert read_response(sock)[0] == 200
        time.sleep(HEAD_TIMEOUT_S * 1.6)
        sock.sendall(head("GET", "/health", {}))
        assert read_response(sock)[0] == 200
        idle_since = time.monotonic()
        assert read_until_closed(sock) == b""
        assert KEEP_ALIVE_S * 0.8 <= time.monotonic() - idle_since < KEEP_ALIVE_S + SLACK_S
