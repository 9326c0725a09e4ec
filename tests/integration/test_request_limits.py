"""What no request may do to a replica: stall it, crash it or get a 500 out of it."""

import asyncio
import json
import socket
import time

import httpx
import openai
import pytest

from steno.services.api.limits import MAX_DEPTH

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"


def post(stack, body: bytes | dict, headers: dict | None = None, timeout: float = 30) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()  # orjson refuses ints beyond 64 bits
    return httpx.post(f"{stack.base_url}/responses", content=content, timeout=timeout,
                      headers={"content-type": "application/json", **stack.headers(), **(headers or {})})


def assert_400(reply: httpx.Response, param: str | None = None) -> dict:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def nested(levels: int) -> dict:
    value: dict = {"type": "string"}
    for _ in range(levels):
        value = {"type": "object", "properties": {"x": value}}
    return value


BAD_BODIES = [
    ({"model": MODEL, "input": "a\x00b"}, "input"),
    ({"model": MODEL, "input": [{"role": "user", "content": "x\x00"}]}, "input[0].content"),
    ({"model": MODEL, "input": "x", "instructions": "\x00"}, "instructions"),
    ({"model": MODEL, "input": "x", "max_output_tokens": 2**64}, "max_output_tokens"),
    ({"model": MODEL, "input": "x", "seed": 2**64}, "seed"),
    ({"model": MODEL, "input": "x", "tools": [{"type": "function", "name": "f", "parameters": nested(MAX_DEPTH + 5)}]},
     None),
    ({"model": MODEL, "input": [nested(MAX_DEPTH + 5) | {"type": "message", "role": "user", "content": "x"}]}, None),
    ({"model": MODEL, "input": "x", "text": {"format": {"type": "json_schema", "name": "n",
                                                         "schema": nested(MAX_DEPTH + 5)}}}, None),
    ({"model": MODEL, "input": "x", "tools": [{"type": "function", "name": "f"}],
      "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": "f"}}, "tool_choice.tools"),
    ({"model": MODEL, "input": [{"role": "user", "content": "x"}, {"type": "web_search_call", "action": "search"}]},
     "input[1].action"),
    ({"model": MODEL, "input": [{"type": "function_call_output", "call_id": ["c1"], "output": "x"}]},
     "input[0].call_id"),
    ({"model": MODEL, "input": "x", "tools": [{"type": "custom", "name": "patch", "format": "grammar"}]},
     "tools[0].format"),
    ({"model": MODEL, "input": [{"type": "code_interpreter_call", "code": 7}]}, "input[0].code"),
    ({"model": MODEL, "input": [{"type": "mcp_call", "name": "list", "server_label": 7}]}, "input[0].server_label"),
    ({"model": MODEL, "input": [{"role": "user", "content": "x", "id": 7}]}, "input[0].id"),
    ({"model": MODEL, "input": [{"type": "function_call", "call_id": "c", "name": "a b<|call|>", "arguments": "{}"}]},
     "input[0].name"),
    ({"model": MODEL, "input": "x", "tools": [{"type": "function", "name": "f", "description": 7}]},
     "tools[0].description"),
]


@pytest.mark.parametrize(("body", "param"), BAD_BODIES)
def test_bad_input_is_a_400_naming_the_field(stack, body, param):
    assert_400(post(stack, body), param)


@pytest.mark.parametrize("raw", [
    b'{"model": "steno-simulator", "input": "a\\ud800b"}',
    b'{"model": "steno-simulator", "input": "x", "metadata": ' + b"[" * 3000 + b"]" * 3000 + b"}",
])
@pytest.mark.parametrize("content_type", ["application/json", None])
def test_json_that_the_api_cannot_hold_is_a_400_whatever_the_content_type_says(stack, raw, content_type):
    headers = {**stack.headers()}
    if content_type:
        headers["content-type"] = content_type
    reply = httpx.post(f"{stack.base_url}/responses", content=raw, headers=headers, timeout=30)
    assert_400(reply)


@pytest.mark.parametrize("path", ["/responses/resp_x%00y", "/responses/resp_x%00y/input_items",
                                  "/responses/%ED%A0%80", "/responses/" + "a" * 5000])
def test_a_path_that_names_nothing_is_a_404(stack, path):
    reply = httpx.get(f"{stack.base_url}{path}", headers=stack.headers(), timeout=10)
    assert reply.status_code == 404, reply.text
    assert reply.json()["error"]["param"] == "response_id"


def test_an_after_cursor_that_names_nothing_is_a_400(stack, client):
    done = client.responses.create(model=MODEL, input="items")
    reply = httpx.get(f"{stack.base_url}/responses/{done.id}/input_items", params={"after": "msg\x00"},
                      headers=stack.headers(), timeout=10)
    assert_400(reply, "after")


@pytest.mark.parametrize("value", ["1_0", "+1", "1.0", "0x1"])
def test_last_event_id_must_be_plain_digits(stack, client, value):
    done = client.responses.create(model=MODEL, input="cursor", background=True)
    reply = httpx.get(f"{stack.base_url}/responses/{done.id}", params={"stream": "true"}, timeout=10,
                      headers={**stack.headers(), "Last-Event-ID": value})
    assert_400(reply, "Last-Event-ID")


def test_a_degenerate_prompt_is_refused_within_the_budget_while_the_replica_keeps_serving(stack, client):
    """A long run of one character costs a tokenizer time growing with its square; it is
    rendered away from the event loop and refused when it overruns the render budget."""

    async def scenario() -> tuple[httpx.Response, float, list[float]]:
        async with httpx.AsyncClient(timeout=60) as http:
            started = time.monotonic()
            heavy = asyncio.create_task(http.post(f"{stack.base_url}/responses", headers=stack.headers(),
                                                  json={"model": MODEL, "input": "a" * 400_000}))
            health: list[float] = []
            while not heavy.done():
                asked = time.monotonic()
                assert (await http.get(stack.base_url.removesuffix("/v1") + "/health")).status_code == 200
                health.append(time.monotonic() - asked)
                await asyncio.sleep(0.2)
            return await heavy, time.monotonic() - started, health

    refused, elapsed, health = asyncio.run(scenario())
    error = assert_400(refused, "input")
    assert "could not be tokenized" in error["message"]
    assert elapsed < stack.settings.render_timeout_s + 10
    assert len(health) >= 5 and max(health) < 1.0, health
    # And the replica renders the next request as ever.
    assert client.responses.create(model=MODEL, input="still here").output_text.endswith("still here")


def test_a_prompt_beyond_the_models_context_is_a_400_and_records_nothing(stack, client):
    before = client.responses.create(model=MODEL, input="count").id
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="word " * 140_000)
    assert refused.value.code == "context_length_exceeded"
    assert refused.value.param == "input"
    assert client.responses.retrieve(before).status == "completed"


def test_an_unknown_caller_is_refused_before_its_body_is_read(stack):
    """The request says a large body follows and sends none of it: the 401 comes anyway."""
    host, port = stack.base_url.removeprefix("http://").removesuffix("/v1").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer sk-steno-nope\r\nContent-Length: 27000000\r\n\r\n")
        answer = _whole_answer(conn)
    assert answer.startswith("HTTP/1.1 401"), answer
    assert "invalid_api_key" in answer or "Incorrect API key" in answer


def _whole_answer(conn: socket.socket) -> str:
    """A response's head and its body, which may arrive in separate reads."""
    received = b""
    while b"\r\n\r\n" not in received or len(received.split(b"\r\n\r\n", 1)[1]) < _content_length(received):
        chunk = conn.recv(65536)
        if not chunk:
            break
        received += chunk
    return received.decode(errors="replace")


def _content_length(received: bytes) -> int:
    for line in received.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0
