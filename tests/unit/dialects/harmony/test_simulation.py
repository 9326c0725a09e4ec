from steno.schemas.api import CreateResponseRequest
from steno.schemas.responses import ParseContext
from steno.services.dialects import CompletionMessage, MessageEnded, MessageStarted, TextDelta
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


def test_reads_required_parameters_as_json_types():
    assert facts(input="x", tools=[WEATHER]).functions == {
        "get_weather": {"city": "string", "days": "number", "metric": "boolean", "unit": "string"}}


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
