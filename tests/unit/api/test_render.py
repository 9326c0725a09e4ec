import pytest

from steno.schemas.api import CreateResponseRequest
from steno.services.api.render import InvalidInput, build_conversation, render_prompt
from tests.harmony_samples import encoding


def decoded(request: CreateResponseRequest) -> str:
    return encoding().decode(render_prompt(encoding(), request, 1767225600).token_ids)


def test_string_input_system_and_start_date():
    text = decoded(CreateResponseRequest(model="m", input="Hello"))
    assert "Reasoning: medium" in text
    assert "Current date: 2026-01-01" in text
    assert text.endswith("<|start|>user<|message|>Hello<|end|><|start|>assistant")


def test_reasoning_effort_and_instructions():
    text = decoded(CreateResponseRequest(model="m", input="x", instructions="Be terse.", reasoning={"effort": "high"}))
    assert "Reasoning: high" in text
    assert "<|start|>developer<|message|># Instructions\n\nBe terse." in text


def test_system_role_input_becomes_developer_instructions():
    request = CreateResponseRequest(
        model="m", input=[{"role": "system", "content": "Speak French."}, {"role": "user", "content": "Hi"}]
    )
    text = decoded(request)
    assert "# Instructions\n\nSpeak French." in text
    assert "<|start|>system<|message|>Speak French." not in text


def test_function_tools_are_declared():
    tool = {"type": "function", "name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    text = decoded(CreateResponseRequest(model="m", input="x", tools=[tool]))
    assert "namespace functions" in text and "type get_weather" in text


def test_function_call_round_trip_items():
    request = CreateResponseRequest(model="m", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "function_call", "name": "get_weather", "call_id": "call_1", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ])
    text = decoded(request)
    assert "to=functions.get_weather" in text
    assert "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny" in text


@pytest.mark.parametrize(
    ("items", "param"),
    [
        ([{"type": "image_generation_call", "id": "x"}], "input[0].type"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], "input[0].content[0]"),
        ([{"type": "function_call_output", "call_id": "nope", "output": "x"}], "input[0].call_id"),
        ([{"role": "wizard", "content": "x"}], "input[0].role"),
    ],
)
def test_unsupported_input_names_the_item(items, param):
    with pytest.raises(InvalidInput) as info:
        build_conversation(CreateResponseRequest(model="m", input=items), 0)
    assert info.value.param == param


WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather now",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
REASONED_TURN = [
    {"role": "user", "content": "Weather in Paris?"},
    {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "I should call the tool."}]},
    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "18C"},
    {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Now answer."}]},
    {"role": "assistant", "content": "It is 18C."},
]


@pytest.mark.parametrize("request_body", [
    {"input": "Hello"},
    {"input": "x", "instructions": "Be terse.", "reasoning": {"effort": "high"}},
    {"input": "x", "tools": [WEATHER_TOOL], "tool_choice": "required"},
    {"input": "x", "tools": [{"type": "web_search"}, {"type": "code_interpreter", "container": {"type": "auto"}}]},
    # A finished turn: its analysis is dropped, as Harmony drops it.
    {"input": REASONED_TURN + [{"role": "user", "content": "And tomorrow?"}], "tools": [WEATHER_TOOL]},
    # A turn still reasoning: its analysis stays.
    {"input": REASONED_TURN[:4], "tools": [WEATHER_TOOL]},
    {"input": [{"role": "developer", "content": "Speak French."}, {"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Salut", "phase": "commentary"}]},
])
def test_rendering_reuses_messages_and_matches_harmony_rendering_the_whole_conversation(request_body):
    """The prompt is rendered message by message, reusing messages rendered before; it
    must be token for token what Harmony renders for the whole conversation."""
    from openai_harmony import Role

    request = CreateResponseRequest(model="m", **request_body)
    conversation, _ = build_conversation(request, 1767225600)
    whole = encoding().render_conversation_for_completion(conversation, Role.ASSISTANT)
    assert render_prompt(encoding(), request, 1767225600).token_ids == whole
    assert render_prompt(encoding(), request, 1767225600).token_ids == whole  # from the reused messages
