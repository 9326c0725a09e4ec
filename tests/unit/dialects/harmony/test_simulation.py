import pytest

from steno.schemas.api import CreateResponseRequest
from steno.schemas.responses import ParseContext
from steno.services.dialects import CompletionMessage, Grammar, MessageEnded, MessageStarted, OfferedTool, TextDelta
from tests.harmony_samples import encoding, harmony

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "number"},
                                                            "metric": {"type": "boolean"},
                                                            "unit": {"type": "string", "enum": ["C", "F"]}},
                          "required": ["city", "days", "metric", "unit"]}}


def facts(**request):
    return harmony().read_prompt(harmony().render(CreateResponseRequest(model="m", **request), 0).token_ids)


def test_reads_the_last_user_message():
    assert facts(input="What is 2+2?").user_text == "What is 2+2?"


def test_reads_the_parameters_back_as_a_json_schema():
    assert facts(input="x", tools=[WEATHER]).functions["get_weather"] == OfferedTool({
        "type": "object", "required": ["city", "days", "metric", "unit"],
        "properties": {"city": {"type": "string"}, "days": {"type": "number"}, "metric": {"type": "boolean"},
                       "unit": {"enum": ["C", "F"]}}})


NESTED = {"type": "object", "required": ["command", "options"], "properties": {
    "command": {"type": "array", "items": {"type": "string"}, "description": "The command\nto run, one\nper line"},
    "options": {"type": "object", "properties": {"cwd": {"type": "string"}, "limits": {
        "type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]}},
        "required": ["limits"]},
    "tag": {"type": ["string", "null"]}}}


def test_reads_nested_objects_arrays_and_unions_whatever_the_descriptions_say():
    read = facts(input="x", tools=[{"type": "function", "name": "shell", "parameters": NESTED}]).functions["shell"]
    assert read.parameters == {"type": "object", "required": ["command", "options"], "properties": {
        "command": {"type": "array", "items": {"type": "string"}},
        "options": {"type": "object", "required": ["limits"], "properties": {
            "cwd": {"type": "string"},
            "limits": {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]}}},
        "tag": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}


@pytest.mark.parametrize("parameters", [None, {}, {"type": "object", "properties": {}}])
def test_a_function_without_parameters_is_read_as_one(parameters):
    tool = {"type": "function", "name": "ping", **({"parameters": parameters} if parameters is not None else {})}
    assert "ping" in facts(input="x", tools=[tool]).functions


def test_reads_a_custom_tools_grammar_as_a_grammar():
    grammar = 'start: "*** Begin Patch" LF body\nbody: /[a-z]+/ LF\n%import common.LF'
    tool = {"type": "custom", "name": "apply_patch", "description": "Patches files.\nUse with care.",
            "format": {"type": "grammar", "syntax": "lark", "definition": grammar}}
    read = facts(input="x", tools=[tool]).functions["apply_patch"]
    assert read.grammar == Grammar("lark", grammar)
    assert read.parameters["required"] == ["input"]
    plain = facts(input="x", tools=[{"type": "custom", "name": "note"}]).functions["note"]
    assert plain.grammar is None


def test_built_in_tools_are_not_in_the_prompt():
    read = facts(input="x", tools=[{"type": "web_search"}, {"type": "code_interpreter"}])
    assert read.functions == {}
    prompt = encoding().decode(harmony().render(
        CreateResponseRequest(model="m", input="x", tools=[{"type": "web_search"}]), 0).token_ids)
    assert "browser" not in prompt and "## python" not in prompt


def test_reads_the_tool_result_the_prompt_ends_with():
    read = facts(tools=[WEATHER], input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny, 21C"},
    ])
    assert read.tool_result == "sunny, 21C"
    assert facts(input="no tools here").tool_result is None


def test_written_completions_split_back_into_the_same_messages():
    messages = [CompletionMessage("analysis", "Thinking, déjà vu."),
                CompletionMessage("commentary", '{"city":"Paris"}', "functions.get_weather", "json")]
    tokens = harmony().write_completion(messages)
    fragments = harmony().splitter(ParseContext(function_tools=["get_weather"])).feed(tokens)
    started = [f for f in fragments if isinstance(f, MessageStarted)]
    assert [(s.channel, s.recipient) for s in started] == [("analysis", None), ("commentary", "functions.get_weather")]
    assert "".join(f.text for f in fragments if isinstance(f, TextDelta)) == 'Thinking, déjà vu.{"city":"Paris"}'
    assert sum(isinstance(f, MessageEnded) for f in fragments) == 2
    assert encoding().decode([tokens[-1]]) == "<|call|>"  # a call hands the turn to the tool


def test_a_completion_that_answers_returns():
    tokens = harmony().write_completion([CompletionMessage("final", "Done.")])
    assert encoding().decode([tokens[-1]]) == "<|return|>"


def test_every_described_tool_is_read_each_with_its_own_description():
    grammar = 'start: "x"'
    patch = {"type": "custom", "name": "apply_patch", "description": "Patches.",
             "format": {"type": "grammar", "syntax": "lark", "definition": grammar}}
    shell = {"type": "function", "name": "shell", "description": "Runs a command.\nCarefully.",
             "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
    read = facts(input="x", tools=[WEATHER, patch, shell]).functions
    assert sorted(read) == ["apply_patch", "get_weather", "shell"]
    assert read["apply_patch"].grammar == Grammar("lark", grammar)
    assert read["shell"].grammar is None and read["shell"].parameters["required"] == ["cmd"]
