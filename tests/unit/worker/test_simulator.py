import asyncio
import json
import re
import time

import jsonschema
import lark
import pytest

from steno.schemas.api import CreateResponseRequest
from steno.schemas.bus import SamplingParams, StructuredOutput
from steno.schemas.responses import ParseContext
from steno.services.dialects import MessageStarted, TextDelta
from steno.services.worker.simulator import SimulatorEngine, SimulatorTiming, completion_tokens
from tests.harmony_samples import encoding, harmony


def prompt(user_text: str, **request) -> list[int]:
    return harmony().render(CreateResponseRequest(model="m", input=user_text, **request), 1700000000).token_ids


async def collect(engine, tokens, sampling=SamplingParams()):
    return [o async for o in engine.generate("r", tokens, sampling)]


def simulated(text: str, **request) -> list[int]:
    return completion_tokens(harmony(), prompt(text, **request))


def test_completion_is_well_formed_harmony_with_reasoning_and_answer():
    tokens = simulated("ping")
    fragments = harmony().splitter(ParseContext()).feed(tokens)
    channels = [f.channel for f in fragments if isinstance(f, MessageStarted)]
    assert channels == ["analysis", "final"]
    text = "".join(f.text for f in fragments if isinstance(f, TextDelta))
    assert "ping" in text
    assert tokens[-1] == encoding().encode("<|return|>", allowed_special="all")[0]


def test_deterministic_in_the_input():
    assert simulated("a") == simulated("a")
    assert simulated("a") != simulated("b")


def test_streams_all_tokens_then_stops():
    engine = SimulatorEngine(harmony(), SimulatorTiming(chunk_tokens=5))
    outputs = asyncio.run(collect(engine, prompt("hello")))
    assert sum((o.token_ids for o in outputs), []) == simulated("hello")
    assert [o.finish_reason for o in outputs][-1] == "stop"
    assert all(o.finish_reason is None for o in outputs[:-1])


def test_max_tokens_truncates_with_length():
    engine = SimulatorEngine(harmony())
    outputs = asyncio.run(collect(engine, prompt("hello"), SamplingParams(max_tokens=7)))
    assert sum(len(o.token_ids) for o in outputs) == 7
    assert outputs[-1].finish_reason == "length"


def test_abort_ends_with_cancelled():
    engine = SimulatorEngine(harmony(), SimulatorTiming(tokens_per_s=1000))

    async def scenario():
        outputs = []
        async for output in engine.generate("r", prompt("a long enough request"), SamplingParams()):
            outputs.append(output)
            if len(outputs) == 3:
                await engine.abort("r")
        return outputs

    outputs = asyncio.run(scenario())
    assert outputs[-1].finish_reason == "cancelled"
    assert len(outputs) == 4


def test_token_rate_is_respected():
    engine = SimulatorEngine(harmony(), SimulatorTiming(first_token_delay_s=0.05, tokens_per_s=400))

    async def timed():
        loop = asyncio.get_running_loop()
        start = loop.time()
        outputs = await collect(engine, prompt("hi"))
        return loop.time() - start, sum(len(o.token_ids) for o in outputs)

    elapsed, count = asyncio.run(timed())
    assert elapsed >= 0.05 + (count - 1) / 400 * 0.9


def test_requests_started_apart_get_their_tokens_on_the_same_steps():
    """As from a batched engine: one step yields a token for every running request."""
    engine = SimulatorEngine(harmony(), SimulatorTiming(tokens_per_s=100))

    async def steps_of(request_id: str, start_after_s: float) -> list[int]:
        await asyncio.sleep(start_after_s)
        ticks = []
        async for _ in engine.generate(request_id, prompt("hi"), SamplingParams()):
            ticks.append(ticks_so_far[0])
        return ticks

    ticks_so_far = [0]

    async def count_loop_iterations() -> None:
        while True:
            ticks_so_far[0] += 1
            await asyncio.sleep(0)

    async def both():
        counter = asyncio.create_task(count_loop_iterations())
        try:
            return await asyncio.gather(steps_of("a", 0), steps_of("b", 0.013))
        finally:
            counter.cancel()

    first, second = asyncio.run(both())
    # Once both run, each of the second's tokens comes in the loop iteration of one of the
    # first's (the counter may run between the two); 3 ms apart would be hundreds.
    while_both_ran = [tick for tick in second if tick <= first[-1]]
    assert len(while_both_ran) > 5
    assert all(any(abs(tick - other) <= 1 for other in first) for tick in while_both_ran)


def test_a_reader_steps_behind_gets_the_missed_steps_tokens_in_one_output():
    """As vLLM's output collector merges the deltas a slow reader has not taken: a burst
    of one-token outputs would reach the batcher as if the engine had sped up."""
    engine = SimulatorEngine(harmony(), SimulatorTiming(tokens_per_s=100))  # a step every 10 ms

    async def read_with_a_stall() -> list[list[int]]:
        outputs = []
        async for output in engine.generate("r", prompt("a long enough request"), SamplingParams()):
            outputs.append(output.token_ids)
            if len(outputs) == 3:
                time.sleep(0.105)  # the loop blocked: ten steps go by unread
        return outputs

    outputs = asyncio.run(read_with_a_stall())
    assert sum(outputs, []) == simulated("a long enough request")
    assert len(outputs[3]) >= 10
    assert len(outputs) <= len(simulated("a long enough request")) - 9


WEATHER = {"type": "function", "name": "get_weather", "description": "Weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "number"}},
                          "required": ["city"]}}


def calls_in(tokens):
    fragments = harmony().splitter(ParseContext()).feed(tokens)
    started = [f for f in fragments if isinstance(f, MessageStarted)]
    return started, "".join(f.text for f in fragments if isinstance(f, TextDelta))


def test_offered_function_tools_are_called_with_required_arguments():
    started, text = calls_in(simulated("Paris", tools=[WEATHER]))
    assert started[-1].recipient == "functions.get_weather"
    assert text.endswith('{"city":"Paris"}')


def test_after_a_tool_result_it_answers():
    tokens = completion_tokens(harmony(), harmony().render(
        CreateResponseRequest(model="m", tools=[WEATHER], input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny, 21C"},
        ]), 0).token_ids)
    started, text = calls_in(tokens)
    assert [s.channel for s in started] == ["analysis", "final"]
    assert text.endswith("Steno simulator reply: the tool returned sunny, 21C")


@pytest.mark.parametrize("parameters", [{}, {"type": "object", "properties": {}}, None])
def test_tools_without_parameters_are_called_with_no_arguments(parameters):
    tool = {"type": "function", "name": "ping", **({"parameters": parameters} if parameters is not None else {})}
    started, text = calls_in(simulated("x", tools=[tool]))
    assert started[-1].recipient == "functions.ping"
    assert text.endswith("{}")


def test_built_in_tools_are_not_called_they_are_not_offered():
    started, text = calls_in(simulated("news", tools=[{"type": "web_search"}, {"type": "code_interpreter"}]))
    assert [s.recipient for s in started] == [None, None]
    assert text.endswith("Steno simulator reply: news")


def final_text(tokens) -> str:
    fragments = harmony().splitter(ParseContext()).feed(tokens)
    texts, channel = [], None
    for fragment in fragments:
        if isinstance(fragment, MessageStarted):
            channel = fragment.channel
        elif isinstance(fragment, TextDelta) and channel == "final":
            texts.append(fragment.text)
    return "".join(texts)


ORDER = {"type": "object", "additionalProperties": False, "required": ["item", "quantity", "gift", "address"],
         "properties": {"item": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1},
                        "gift": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
                        "address": {"$ref": "#/$defs/Address"}},
         "$defs": {"Address": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}


def structured(kind: str, schema=None) -> StructuredOutput:
    return StructuredOutput(kind=kind, json_schema=schema)


def test_an_answer_asked_for_as_json_matches_the_schema():
    text_format = {"type": "json_schema", "name": "order", "schema": ORDER}
    tokens = completion_tokens(harmony(), prompt("two books", text={"format": text_format}),
                               structured("json_schema", ORDER))
    answer = json.loads(final_text(tokens))
    jsonschema.validate(answer, ORDER)
    assert answer["item"].endswith("two books")


def test_json_object_answers_are_objects_and_tool_results_too():
    assert isinstance(json.loads(final_text(completion_tokens(harmony(), prompt("hi"), structured("json_object")))),
                      dict)
    after_tool = harmony().render(CreateResponseRequest(model="m", tools=[WEATHER], input=[
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]), 0).token_ids
    answer = json.loads(final_text(completion_tokens(harmony(), after_tool, structured("json_schema", ORDER))))
    jsonschema.validate(answer, ORDER)


def test_the_engine_honours_the_requests_format():
    engine = SimulatorEngine(harmony())
    outputs = asyncio.run(collect(engine, prompt("hi"), SamplingParams(structured_output=structured("json_object"))))
    assert json.loads(final_text(sum((o.token_ids for o in outputs), []))) == {"reply": "Steno simulator reply: hi"}
    plain = asyncio.run(collect(engine, prompt("hi")))
    assert final_text(sum((o.token_ids for o in plain), [])) == "Steno simulator reply: hi"


SHELL = {"type": "function", "name": "shell", "parameters": {
    "type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
    "required": ["command"]}}
PATCH_GRAMMAR = 'start: "*** Begin Patch" LF hunk+ "*** End Patch"\nhunk: "*** Add File: " /[a-z]+/ LF\n' \
                "%import common.LF"
APPLY_PATCH = {"type": "custom", "name": "apply_patch",
               "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR}}


def test_a_directive_in_the_users_text_calls_that_tool_with_those_arguments():
    started, text = calls_in(simulated('Run it.\nsteno-simulator: call shell {"command": ["echo", "hi"]}',
                                       tools=[SHELL, APPLY_PATCH, WEATHER]))
    assert started[-1].recipient == "functions.shell"
    assert text.endswith('{"command": ["echo", "hi"]}')
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch"
    started, text = calls_in(simulated(f"steno-simulator: call apply_patch {patch}", tools=[SHELL, APPLY_PATCH]))
    assert started[-1].recipient == "functions.apply_patch"
    assert text.endswith(json.dumps({"input": patch}, separators=(",", ":")))


def test_a_directive_for_a_tool_not_offered_is_answered_not_called():
    started, text = calls_in(simulated("steno-simulator: call rm {}", tools=[SHELL]))
    assert [s.recipient for s in started] == [None, None]
    assert text.endswith("no tool named rm is offered.")


def test_a_custom_tools_input_is_a_sentence_of_its_grammar():
    started, text = calls_in(simulated("x", tools=[APPLY_PATCH]))
    assert started[-1].recipient == "functions.apply_patch"
    patch = json.loads(text[text.index('{"input"'):])["input"]
    lark.Lark(PATCH_GRAMMAR).parse(patch)
    regex_tool = {"type": "custom", "name": "ticket",
                  "format": {"type": "grammar", "syntax": "regex", "definition": r"[A-Z]{3}-\d{4}"}}
    _, text = calls_in(simulated("x", tools=[regex_tool]))
    assert re.fullmatch(r"[A-Z]{3}-\d{4}", json.loads(text[text.index('{"input"'):])["input"])


def test_arguments_fill_nested_parameters():
    _, text = calls_in(simulated("Paris", tools=[SHELL]))
    assert text.endswith('{"command":[]}')


def test_answers_can_be_padded_to_a_length_for_load():
    tokens = completion_tokens(harmony(), prompt("hi"), min_tokens=500)
    assert 500 <= len(tokens) <= 510
    assert final_text(tokens).startswith("Steno simulator reply: hi more more")
    engine = SimulatorEngine(harmony(), answer_tokens=300)
    assert sum(len(o.token_ids) for o in asyncio.run(collect(engine, prompt("hi")))) >= 300
