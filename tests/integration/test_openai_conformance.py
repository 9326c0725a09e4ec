"""What clients of OpenAI's Responses API expect of the objects and routes, through the
SDK against the real stack."""

import time

import httpx
import openai
import pytest
from openai.types.responses import Response
from pydantic import BaseModel, Field

from tests.conftest import SLOW_MODEL, SMALL_CONTEXT_TOKENS, SMALL_MODEL

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"
WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_a_finished_response_carries_every_field_with_openais_defaults(client):
    before = int(time.time())
    done = client.responses.create(model=MODEL, input="fields", service_tier="auto",
                                   reasoning={"effort": "xhigh", "summary": "auto"})
    assert set(Response.model_fields) <= set(done.model_dump())
    assert done.completed_at is not None and before <= done.completed_at <= time.time() + 1
    assert (done.service_tier, done.top_logprobs, done.max_tool_calls) == ("default", 0, None)
    text_part = done.output[-1].content[0]
    assert text_part.logprobs == []  # a list even when none were asked for, as OpenAI sends
    assert client.responses.retrieve(done.id).completed_at == done.completed_at


def test_nulls_client_metadata_and_every_reasoning_effort_are_accepted(stack):
    body = {"model": MODEL, "input": "codex says hi", "store": None, "background": None, "truncation": None,
            "client_metadata": {"x-codex": "1"}, "reasoning": {"effort": "none", "context": "current_turn"},
            "prompt_cache_key": "thread-1", "safety_identifier": "user-1", "text": {"verbosity": "low"}}
    reply = httpx.post(f"{stack.base_url}/responses", json=body, headers=stack.headers(), timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == "completed"
    assert reply.json()["prompt_cache_key"] == "thread-1" and reply.json()["safety_identifier"] == "user-1"


@pytest.mark.parametrize(("field", "value"), [("prompt", {"id": "pmpt_1"})])
def test_state_this_server_does_not_hold_is_refused_not_ignored(client, field, value):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL, input="x", extra_body={field: value})
    assert refused.value.param == field and refused.value.code == "unsupported_parameter"


def test_no_tool_calls_allowed_means_no_tool_is_offered(client):
    done = client.responses.create(model=MODEL, input="Paris", tools=[WEATHER], max_tool_calls=0)
    assert [item.type for item in done.output] == ["reasoning", "message"]
    called = client.responses.create(model=MODEL, input="Paris", tools=[WEATHER])
    assert called.output[-1].type == "function_call"


def test_models_are_listed_from_the_live_workers(client):
    listed = {model.id: model for model in client.models.list()}
    assert {MODEL, SLOW_MODEL} <= set(listed)
    assert listed[MODEL].object == "model" and listed[MODEL].created > 0
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.code == "model_not_found"


def test_input_tokens_are_what_the_response_then_reports(client):
    counted = client.responses.input_tokens.count(model=MODEL, input="count me", instructions="Be brief.",
                                                  tools=[WEATHER])
    assert counted.object == "response.input_tokens" and counted.input_tokens > 0
    done = client.responses.create(model=MODEL, input="count me", instructions="Be brief.", tools=[WEATHER])
    assert done.usage.input_tokens == counted.input_tokens


def test_a_wrong_method_is_a_405_in_openais_shape(stack):
    reply = httpx.put(f"{stack.base_url}/responses", headers=stack.headers(), timeout=10)
    assert reply.status_code == 405
    assert reply.json()["error"]["type"] == "invalid_request_error"


class Trip(BaseModel):
    city: str
    nights: int = Field(ge=1)
    notes: list[str]


def test_structured_output_parses_as_the_sdk_asks(client):
    parsed = client.responses.parse(model=MODEL, input="Two nights in Rome", text_format=Trip)
    assert isinstance(parsed.output_parsed, Trip)
    assert parsed.output_parsed.city.endswith("Two nights in Rome") and parsed.output_parsed.nights >= 1
    assert parsed.text.format.type == "json_schema"


def test_item_references_are_resolved_from_the_tenants_stored_items(client, other_tenant):
    first = client.responses.create(model=MODEL, input="Paris", tools=[WEATHER])
    asked = client.responses.input_items.list(first.id).data[0]
    reasoning, call = first.output[0], first.output[-1]
    follow = [{"type": "item_reference", "id": item_id} for item_id in (asked.id, reasoning.id, call.id)]
    follow.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C"})
    answer = client.responses.create(model=MODEL, input=follow, tools=[WEATHER])
    assert answer.output_text.endswith("the tool returned sunny, 21C")
    listed = client.responses.input_items.list(answer.id, order="asc").data
    assert [item.type for item in listed] == ["message", "reasoning", "function_call", "function_call_output"]
    assert listed[2].call_id == call.call_id and listed[1].content[0].text == reasoning.content[0].text
    unstored = client.responses.create(model=MODEL, input="Paris", tools=[WEATHER], store=False)
    for missing, who in ((unstored.output[0].id, client), (reasoning.id, other_tenant), ("msg_nothing", client)):
        with pytest.raises(openai.BadRequestError) as refused:
            who.responses.create(model=MODEL, input=[{"type": "item_reference", "id": missing}])
        assert refused.value.param == "input[0].id" and "not found" in refused.value.message


def long_conversation(turns: int) -> list[dict]:
    items = []
    for turn in range(turns):
        items += [{"role": "user", "content": f"Question {turn}: " + "tell me more " * 20},
                  {"role": "assistant", "content": f"Answer {turn}: " + "here is more " * 20}]
    return [*items, {"role": "user", "content": "And the last question?"}]


def test_truncation_auto_leaves_out_the_oldest_turns_and_says_so(client):
    conversation = long_conversation(12)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=SMALL_MODEL, input=conversation)
    assert refused.value.code == "context_length_exceeded"
    done = client.responses.create(model=SMALL_MODEL, input=conversation, truncation="auto")
    assert done.status == "completed" and done.truncation == "auto"
    assert done.output_text == "Steno simulator reply: And the last question?"
    left_out = done.model_extra["truncated_items"]
    assert left_out % 2 == 0 and 0 < left_out < len(conversation)  # whole turns
    counted = client.responses.input_tokens.count(model=SMALL_MODEL, input=conversation, truncation="auto")
    assert counted.input_tokens < SMALL_CONTEXT_TOKENS <= client.responses.input_tokens.count(
        model=SMALL_MODEL, input=conversation[:1] * 40).input_tokens
    assert len(client.responses.input_items.list(done.id, limit=100).data) == len(conversation)  # as sent
    # Continuing the chain keeps fitting, its history truncated the same way.
    following = client.responses.create(model=SMALL_MODEL, input="One more?", previous_response_id=done.id,
                                        truncation="auto")
    assert following.output_text == "Steno simulator reply: One more?"
    assert "truncated_items" not in client.responses.create(model=SMALL_MODEL, input="short").model_extra


def test_a_last_turn_too_long_for_the_context_is_refused_even_with_truncation(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=SMALL_MODEL, input="word " * 2000, truncation="auto")
    assert refused.value.code == "context_length_exceeded"
