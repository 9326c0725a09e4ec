import asyncio

import orjson
import pytest

from steno.services.api.routes import CreateFastPath


class Declared:
    """The declared route: records what reached it and the body it read."""

    def __init__(self) -> None:
        self.received: list[dict] = []

    async def __call__(self, scope, receive, send) -> None:
        while True:
            message = await receive()
            self.received.append(message)
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                break


def scope_with(content_type: bytes | None) -> dict:
    headers = [(b"content-type", content_type)] if content_type is not None else []
    return {"type": "http", "method": "POST", "path": "/v1/responses", "headers": headers}


def client_sending(*messages: dict):
    queue = list(messages)

    async def receive() -> dict:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    return receive


async def never_send(message) -> None:
    raise AssertionError(f"the fast path answered itself: {message}")


def run(content_type: bytes | None, *messages: dict) -> list[dict]:
    declared = Declared()
    asyncio.run(CreateFastPath(declared)(scope_with(content_type), client_sending(*messages), never_send))
    return declared.received


def test_a_body_that_is_not_json_goes_to_the_declared_route_untouched():
    sent = {"type": "http.request", "body": b"model=x", "more_body": False}
    assert run(b"application/x-www-form-urlencoded", sent) == [sent]
    assert run(b"text/plain", sent) == [sent]


def answered(content_type: bytes | None, body: bytes) -> tuple[int, dict]:
    """What the fast path answers itself (the declared route must not be reached)."""
    sent: list[dict] = []

    async def send(message) -> None:
        sent.append(message)

    declared = Declared()
    message = {"type": "http.request", "body": body, "more_body": False}
    asyncio.run(CreateFastPath(declared)(scope_with(content_type), client_sending(message), send))
    assert declared.received == []
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], orjson.loads(body)


@pytest.mark.parametrize("content_type", [b"application/json", None, b"application/merge-patch+json"])
@pytest.mark.parametrize("body", [
    b'{"model": "m", "input": "a\\ud800b"}',  # an unpaired surrogate, which FastAPI's parser would take
    b'{"model": "m", "input": "x", "metadata": ' + b'[' * 5000 + b']' * 5000 + b'}',  # nesting beyond any limit
    b'{"model": "m", "input": ',
])
def test_json_that_is_not_valid_is_refused_here_whatever_json_content_type(content_type, body):
    status, error = answered(content_type, body)
    assert status == 400
    assert error["error"]["message"] == "The request body is not valid JSON."


def test_an_invalid_body_reaches_the_declared_route_whole_though_already_read():
    chunks = [{"type": "http.request", "body": b'{"model": "m", ', "more_body": True},
              {"type": "http.request", "body": b'"bogus": 1}', "more_body": False}]
    received = run(b"application/json; charset=utf-8", *chunks)
    assert received == [{"type": "http.request", "body": b'{"model": "m", "bogus": 1}', "more_body": False}]


def test_after_the_replayed_body_the_declared_route_hears_the_client_again():
    heard: list[dict] = []

    async def streaming_route(scope, receive, send) -> None:
        heard.append(await receive())
        heard.append(await receive())  # a stream waiting for the client to leave

    receive = client_sending({"type": "http.request", "body": b'{"model": "m"}', "more_body": False})
    asyncio.run(CreateFastPath(streaming_route)(scope_with(b"application/json"), receive, never_send))
    assert heard == [{"type": "http.request", "body": b'{"model": "m"}', "more_body": False},
                     {"type": "http.disconnect"}]
