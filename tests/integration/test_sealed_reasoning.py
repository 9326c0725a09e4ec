"""Sealed reasoning for stateless clients (``include: ["reasoning.encrypted_content"]``,
``store=false``), through the SDK against the real stack: the blob carries the reasoning
across a tool-call turn, and nothing but the blob this server made, for this tenant,
under a key it still holds, opens."""

import asyncio

import openai
import pytest

from steno.services.common import reasoning_keys
from steno.services.common.reasoning_seal import key_id_of

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"
SEALED = ["reasoning.encrypted_content"]
WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def first_turn(client):
    done = client.responses.create(model=MODEL, input="Paris", tools=[WEATHER], store=False, include=SEALED)
    reasoning, call = done.output[0], done.output[-1]
    assert reasoning.type == "reasoning" and call.type == "function_call"
    return reasoning, call


def next_turn(reasoning_item, call):
    """What a stateless client sends after running the tool: the whole exchange, the
    reasoning as the item it got back."""
    return [{"role": "user", "content": "Paris"}, reasoning_item,
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C"}]


def blob_only(reasoning, blob=None):
    return {"type": "reasoning", "id": reasoning.id, "summary": [],
            "encrypted_content": reasoning.encrypted_content if blob is None else blob}


def count(client, items):
    return client.responses.input_tokens.count(model=MODEL, input=items, tools=[WEATHER]).input_tokens


def test_the_blob_carries_the_reasoning_into_the_next_turn(client):
    reasoning, call = first_turn(client)
    assert reasoning.encrypted_content and reasoning.content[0].text not in reasoning.encrypted_content
    answer = client.responses.create(model=MODEL, input=next_turn(blob_only(reasoning), call), tools=[WEATHER],
                                     store=False, include=SEALED)
    assert answer.output_text.endswith("the tool returned sunny, 21C")
    as_text = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text",
                                                               "text": reasoning.content[0].text}]}
    forgotten = {"type": "reasoning", "summary": [], "content": []}
    assert count(client, next_turn(blob_only(reasoning), call)) == count(client, next_turn(as_text, call)) \
        > count(client, next_turn(forgotten, call))


def test_a_blob_is_sealed_only_when_asked_and_streams_with_the_item(client):
    plain = client.responses.create(model=MODEL, input="Paris", tools=[WEATHER], store=False)
    assert plain.output[0].encrypted_content is None
    with client.responses.stream(model=MODEL, input="Paris", tools=[WEATHER], store=False, include=SEALED) as stream:
        done = [event.item for event in stream if event.type == "response.output_item.done"]
        final = stream.get_final_response()
    assert done[0].type == "reasoning" and done[0].encrypted_content
    assert final.output[0].encrypted_content == done[0].encrypted_content


def test_an_altered_blob_is_a_400_naming_it(client):
    reasoning, call = first_turn(client)
    blob = reasoning.encrypted_content
    middle = len(blob) // 2
    altered = blob[:middle] + ("A" if blob[middle] != "A" else "B") + blob[middle + 1:]
    for bad in (altered, "not-a-blob", blob[:20]):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model=MODEL, input=next_turn(blob_only(reasoning, bad), call), tools=[WEATHER])
        assert refused.value.param == "input[1].encrypted_content"
        assert refused.value.code == "invalid_encrypted_content"


def test_another_tenants_blob_does_not_open(client, other_tenant):
    reasoning, call = first_turn(client)
    with pytest.raises(openai.BadRequestError) as refused:
        other_tenant.responses.create(model=MODEL, input=next_turn(blob_only(reasoning), call), tools=[WEATHER])
    assert refused.value.code == "invalid_encrypted_content"


async def test_rotation_seals_with_the_new_key_and_retiring_the_old_one_ends_its_blobs(client, db):
    old_reasoning, old_call = first_turn(client)
    old_key = key_id_of(old_reasoning.encrypted_content)
    new_key = await reasoning_keys.rotate(db)
    await asyncio.sleep(reasoning_keys.REFRESH_S + 0.5)  # every replica has read the keys again
    new_reasoning, new_call = first_turn(client)
    assert key_id_of(new_reasoning.encrypted_content) == new_key != old_key
    assert count(client, next_turn(blob_only(old_reasoning), old_call)) > 0  # still opens
    assert await reasoning_keys.retire(db, old_key)
    await asyncio.sleep(reasoning_keys.REFRESH_S + 0.5)
    with pytest.raises(openai.BadRequestError) as refused:
        count(client, next_turn(blob_only(old_reasoning), old_call))
    assert refused.value.code == "invalid_encrypted_content" and "does not hold" in refused.value.message
    assert count(client, next_turn(blob_only(new_reasoning), new_call)) > 0
