"""Chat-template models through the real services: a simulated model of each family
(its real template, its reasoning and tool-call markup) served next to the rest, read
by the official SDK. The API and the parser have no model directory: they fetch the
tokenizer and template the worker published on the bus."""

import json

import openai
import pytest

from steno.infra.processes import Stack
from tests.conftest import reparses_identically, separate_stack

pytestmark = pytest.mark.integration

FAMILIES = ["qwen3", "deepseek", "hermes", "llama3", "mistral"]
REASONING = {"qwen3", "deepseek"}
REPLY = "Steno simulator reply: "
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def model_of(family: str) -> str:
    return f"sim-{family}"


@pytest.fixture(scope="module")
def chat_stack(settings, tmp_path_factory):
    """Its own namespace, and a model files directory no service has seen."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STENO_MODEL_FILES_DIR", str(tmp_path_factory.mktemp("model-files")))
        with separate_stack(settings, "chat", tmp_path_factory.mktemp("chat-logs")) as stack:
            stack.add("parser", "parser")
            for family in FAMILIES:
                stack.add(f"worker-{family}", "worker", "--model", model_of(family), "--sim-dialect", family,
                          "--sim-tokens-per-s", "0")
            stack.add_api()
            yield stack


@pytest.fixture
def sdk(chat_stack):
    return openai.OpenAI(base_url=chat_stack.base_url, api_key=chat_stack.keys["a"], max_retries=0, timeout=60)


def audited(stack: Stack, response_id: str) -> bool:
    return reparses_identically(stack.settings, response_id)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_plain_answer_streams_and_agrees_with_the_stored_response(family, sdk, chat_stack):
    with sdk.responses.stream(model=model_of(family), input="Déjà vu, 日本 🎉") as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == REPLY + "Déjà vu, 日本 🎉"
    kinds = [item.type for item in final.output]
    assert kinds == (["reasoning", "message"] if family in REASONING else ["message"])
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text
    stored = sdk.responses.retrieve(final.id)
    assert [item.id for item in stored.output] == [item.id for item in final.output]
    assert stored.output_text == final.output_text and stored.usage == final.usage
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert audited(chat_stack, final.id)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tool_call_round_trip(family, sdk, chat_stack):
    asked = sdk.responses.create(model=model_of(family), input="Paris", tools=[WEATHER_TOOL])
    calls = [item for item in asked.output if item.type == "function_call"]
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [("get_weather", {"city": "Paris"})]
    assert not asked.output_text  # no markup leaks into the answer
    answered = sdk.responses.create(
        model=model_of(family), previous_response_id=asked.id, tools=[WEATHER_TOOL],
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}])
    assert answered.output_text == REPLY + "the tool returned sunny, 21 C"
    assert audited(chat_stack, asked.id) and audited(chat_stack, answered.id)


def test_tool_choice_none_offers_no_tools_and_the_answer_is_text(sdk):
    reply = sdk.responses.create(model=model_of("qwen3"), input="Paris", tools=[WEATHER_TOOL], tool_choice="none")
    assert [item.type for item in reply.output] == ["reasoning", "message"]
    assert reply.output_text == REPLY + "Paris"


def test_effort_none_turns_qwen3s_thinking_off(sdk):
    reply = sdk.responses.create(model=model_of("qwen3"), input="no thinking", reasoning={"effort": "none"})
    assert [item.type for item in reply.output] == ["message"]
    assert reply.output_text == REPLY + "no thinking"


def test_the_models_are_listed_with_the_rest(sdk):
    listed = {model.id for model in sdk.models.list()}
    assert {model_of(family) for family in FAMILIES} <= listed


@pytest.mark.parametrize("family", ["qwen3", "llama3"])
def test_a_custom_tool_comes_back_as_a_custom_tool_call_and_a_namespaced_one_by_its_name(family, sdk):
    patch_tool = {"type": "custom", "name": "apply_patch", "description": "Apply a patch."}
    asked = sdk.responses.create(model=model_of(family), input="*** Begin Patch", tools=[patch_tool])
    (call,) = [item for item in asked.output if item.type == "custom_tool_call"]
    assert (call.name, call.input) == ("apply_patch", "*** Begin Patch")

    crm = {"type": "namespace", "name": "crm", "description": "The CRM.", "tools": [WEATHER_TOOL]}
    asked = sdk.responses.create(model=model_of(family), input="Oslo", tools=[crm])
    (call,) = [item for item in asked.output if item.type == "function_call"]
    assert (call.name, call.namespace, json.loads(call.arguments)) == ("get_weather", "crm", {"city": "Oslo"})
