"""The foundation's user-facing promises, through the real processes with the SDK."""

import asyncio

import httpx
import openai
import orjson
import pytest

from tests.events_oracle import validate_events

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"


def test_create_returns_completed_response_with_reasoning_and_message(client):
    response = client.responses.create(model=MODEL, input="hi")
    assert response.status == "completed"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text
    assert response.output_text == "Steno simulator reply: hi"
    assert response.usage.output_tokens > response.usage.output_tokens_details.reasoning_tokens > 0


def test_stream_yields_gapless_lifecycle_and_content_events(client):
    with client.responses.stream(model=MODEL, input="stream this please") as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    for kind in ("response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
                 "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                 "response.output_item.done"):
        assert kind in types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == "Steno simulator reply: stream this please"


def test_retrieve_returns_the_same_final_response(client):
    with client.responses.stream(model=MODEL, input="remember me") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    retrieved = client.responses.retrieve(final.id)
    assert retrieved.model_dump(exclude={"output"}) == final.model_dump(exclude={"output"})
    assert [i.model_dump() for i in retrieved.output] == [
        i.model_dump(exclude={"content": {"__all__": {"parsed"}}}) if i.type == "message" else i.model_dump()
        for i in final.output
    ]


async def test_event_log_equals_what_the_stream_delivered(stack, db):
    with httpx.stream("POST", stack.base_url + "/responses", json={"model": MODEL, "input": "log me", "stream": True},
                      headers=stack.headers(), timeout=30) as reply:
        body = reply.read().decode()
    frames = [f for f in body.split("\n\n") if f.strip()]
    wire = []
    for block in frames:
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        wire.append((int(fields["id"]), fields["event"], fields["data"]))
    response_id = orjson.loads(wire[0][2])["response"]["id"]
    stored = await db.fetch(
        "SELECT seq, type, payload FROM response_events WHERE response_id = $1 ORDER BY seq", response_id
    )
    assert [tuple(r) for r in stored] == wire
    validate_events([payload for _, _, payload in wire])
    tokens = await db.fetchval("SELECT count(*) FROM response_tokens WHERE response_id = $1", response_id)
    assert tokens >= 2  # at least one token batch and the end of the attempt


async def test_responses_created_at_the_same_moment_are_each_stored_whole(stack):
    """Creates arriving together share one insert; each still gets its own row, its input
    items in order and its own stream."""
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0)
    inputs = [[{"role": "user", "content": f"first {i}"}, {"role": "user", "content": f"second {i}"}]
              for i in range(24)]
    created = await asyncio.gather(*(client.responses.create(model=MODEL, input=given, background=True)
                                      for given in inputs))
    assert len({response.id for response in created}) == len(inputs)
    for given, response in zip(inputs, created):
        items = await client.responses.input_items.list(response.id, order="asc")
        assert [item.content[0].text for item in items.data] == [message["content"] for message in given]
        async with client.responses.stream(response_id=response.id) as stream:
            final = await stream.get_final_response()
        assert final.output_text == f"Steno simulator reply: {given[-1]['content']}"


def test_background_response_is_queued_then_completes(client):
    created = client.responses.create(model=MODEL, input="later", background=True)
    assert created.status == "queued"
    with client.responses.stream(response_id=created.id) as stream:
        for _ in stream:
            pass
    assert client.responses.retrieve(created.id).status == "completed"


def test_stream_resumes_after_a_cursor(stack, client):
    final = client.responses.create(model=MODEL, input="resume")
    with httpx.stream("GET", f"{stack.base_url}/responses/{final.id}",
                      params={"stream": "true", "starting_after": 5}, headers=stack.headers(), timeout=30) as reply:
        ids = [int(line[4:]) for line in reply.iter_lines() if line.startswith("id: ")]
    assert ids[0] == 6 and ids == list(range(6, ids[-1] + 1))


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": "x", "bogus": 1}, "bogus"),
        ({"model": MODEL, "input": [{"type": "no_such_item"}]}, "input[0].type"),
        ({"model": MODEL, "input": "x", "temperature": "hot"}, "temperature"),
        ({"model": MODEL, "input": "x", "tools": [{"type": "warp_drive"}]}, "tools[0].type"),
    ],
)
def test_bad_input_is_a_400_in_openai_shape(stack, body, param):
    reply = httpx.post(stack.base_url + "/responses", json=body, headers=stack.headers(), timeout=10)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_malformed_json_body_is_a_400(stack):
    reply = httpx.post(stack.base_url + "/responses", content=b"{not json",
                       headers={"content-type": "application/json", **stack.headers()}, timeout=10)
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"


def test_a_body_that_is_not_json_is_a_400(stack):
    reply = httpx.post(stack.base_url + "/responses", content=b'{"model": "x", "input": "hi"}',
                       headers={"content-type": "text/plain", **stack.headers()}, timeout=10)
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == "The request body must be a JSON object."


def test_json_with_a_charset_streams(stack):
    body = b'{"model": "%s", "input": "charset", "stream": true}' % MODEL.encode()
    with httpx.stream("POST", stack.base_url + "/responses", content=body, timeout=30,
                      headers={"content-type": "application/json; charset=utf-8", **stack.headers()}) as reply:
        types = [line[7:] for line in reply.iter_lines() if line.startswith("event: ")]
    assert reply.status_code == 200
    assert types[0] == "response.created" and types[-1] == "response.completed"


def test_unknown_response_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.retrieve("resp_missing")
    assert info.value.body["param"] == "response_id"


def test_sdk_raises_bad_request_for_unsupported_item(client):
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": "x"}])
