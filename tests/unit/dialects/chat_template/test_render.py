import json

import pytest

from steno.schemas.api import CreateResponseRequest
from steno.services.dialects.chat_template.render import build_chat

SYSTEM = frozenset({"system"})
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}


def chat(history=(), roles=SYSTEM, **request):
    return build_chat(CreateResponseRequest(model="m", **request), list(history), roles)


def test_instructions_and_system_input_become_the_system_message():
    built = chat(instructions="Be brief.", input=[{"role": "developer", "content": "Use metric."},
                                                   {"role": "user", "content": "hi"}])
    assert built.messages == [{"role": "system", "content": "Be brief.\n\nUse metric."},
                              {"role": "user", "content": "hi"}]


def test_a_template_without_a_system_role_gets_the_instructions_ahead_of_the_first_user_message():
    built = chat(roles=frozenset(), instructions="Be brief.", input="hi")
    assert built.messages == [{"role": "user", "content": "Be brief.\n\nhi"}]


def test_a_text_format_is_said_with_the_instructions():
    built = chat(input="hi", text={"format": {"type": "json_object"}})
    assert built.messages[0]["role"] == "system" and "# Response Formats" in built.messages[0]["content"]


def test_history_is_replayed_without_its_reasoning_and_calls_fold_into_one_assistant_message():
    history = [
        {"type": "message", "role": "user", "content": "weather?"},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "earlier thoughts"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "cold"},
        {"type": "function_call_output", "call_id": "call_2", "output": "warm"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Cold and warm."}]},
    ]
    built = chat(history, tools=[WEATHER], input="thanks")
    assert built.messages == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "cold"},
        {"role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "warm"},
        {"role": "assistant", "content": "Cold and warm."},
        {"role": "user", "content": "thanks"},
    ]


def test_a_tool_loop_under_way_keeps_its_reasoning_for_templates_that_render_it():
    built = chat(tools=[WEATHER], input=[
        {"type": "message", "role": "user", "content": "weather?"},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "I should look it up."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "cold"},
    ])
    assert built.messages[1]["reasoning_content"] == "I should look it up."
    assert built.messages[1]["tool_calls"][0]["function"]["arguments"] == {}


def test_custom_tools_are_functions_of_one_string_and_their_calls_carry_it():
    built = chat(tools=[{"type": "custom", "name": "apply_patch", "description": "Patch."}], input=[
        {"type": "message", "role": "user", "content": "fix it"},
        {"type": "custom_tool_call", "call_id": "call_9", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "call_9", "output": "done"},
    ])
    (offered,) = built.tools
    assert offered["function"]["parameters"]["required"] == ["input"]
    assert built.messages[1]["tool_calls"][0]["function"]["arguments"] == {"input": "*** Begin Patch"}


def test_namespaced_tools_are_offered_flattened_and_their_parameter_types_known():
    built = chat(tools=[{"type": "namespace", "name": "crm", "description": "CRM.", "tools": [WEATHER]}], input="x")
    assert [tool["function"]["name"] for tool in built.tools] == ["crm.get_weather"]
    assert built.parameter_types == {"crm.get_weather": {"city": "string", "days": "integer"}}


def test_tool_choice_none_offers_nothing():
    assert chat(tools=[WEATHER], tool_choice="none", input="x").tools == []


def test_an_unknown_item_with_text_is_replayed_as_user_text_and_one_without_is_left_out():
    built = chat(input=[{"type": "compaction_summary", "content": "what was said before"},
                        {"type": "opaque_marker", "id": "x"},
                        {"role": "user", "content": "go on"}])
    assert built.messages == [{"role": "user", "content": "what was said before"},
                              {"role": "user", "content": "go on"}]


@pytest.mark.parametrize("arguments", ["not json", ""])
def test_call_arguments_that_are_not_json_stay_text_and_none_are_an_empty_object(arguments):
    built = chat(tools=[WEATHER], input=[
        {"role": "user", "content": "x"},
        {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": arguments},
    ])
    expected = arguments or {}
    assert built.messages[1]["tool_calls"][0]["function"]["arguments"] == expected
    json.dumps(built.messages)  # what the template gets is plain JSON data
