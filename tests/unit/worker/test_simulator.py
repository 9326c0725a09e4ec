import asyncio

from steno.schemas.api import CreateResponseRequest
from steno.schemas.bus import SamplingParams
from steno.services.api.render import render_prompt
from steno.services.parser.harmony import HarmonyStreamSplitter, MessageStarted, TextDelta
from steno.services.worker.simulator import SimulatorEngine, SimulatorTiming, completion_tokens, read_prompt
from tests.harmony_samples import encoding


def prompt(text: str) -> list[int]:
    return render_prompt(encoding(), CreateResponseRequest(model="m", input=text), 1700000000).token_ids


async def collect(engine, tokens, sampling=SamplingParams()):
    return [o async for o in engine.generate("r", tokens, sampling)]


def facts(text: str, **request):
    return read_prompt(encoding(), render_prompt(encoding(), CreateResponseRequest(model="m", input=text, **request), 0).token_ids)


def test_reads_the_last_user_message():
    assert facts("What is 2+2?").user_text == "What is 2+2?"


def test_completion_is_well_formed_harmony_with_reasoning_and_answer():
    tokens = completion_tokens(encoding(), facts("ping"))
    fragments = HarmonyStreamSplitter(encoding()).feed(tokens)
    channels = [f.channel for f in fragments if isinstance(f, MessageStarted)]
    assert channels == ["analysis", "final"]
    text = "".join(f.text for f in fragments if isinstance(f, TextDelta))
    assert "ping" in text
    assert tokens[-1] == encoding().encode("<|return|>", allowed_special="all")[0]


def test_deterministic_in_the_input():
    assert completion_tokens(encoding(), facts("a")) == completion_tokens(encoding(), facts("a"))
    assert completion_tokens(encoding(), facts("a")) != completion_tokens(encoding(), facts("b"))


def test_streams_all_tokens_then_stops():
    engine = SimulatorEngine(encoding(), SimulatorTiming(chunk_tokens=5))
    outputs = asyncio.run(collect(engine, prompt("hello")))
    assert sum((o.token_ids for o in outputs), []) == completion_tokens(encoding(), facts("hello"))
    assert [o.finish_reason for o in outputs][-1] == "stop"
    assert all(o.finish_reason is None for o in outputs[:-1])


def test_max_tokens_truncates_with_length():
    engine = SimulatorEngine(encoding())
    outputs = asyncio.run(collect(engine, prompt("hello"), SamplingParams(max_tokens=7)))
    assert sum(len(o.token_ids) for o in outputs) == 7
    assert outputs[-1].finish_reason == "length"


def test_abort_ends_with_cancelled():
    engine = SimulatorEngine(encoding(), SimulatorTiming(tokens_per_s=1000))

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
    engine = SimulatorEngine(encoding(), SimulatorTiming(first_token_delay_s=0.05, tokens_per_s=400))

    async def timed():
        loop = asyncio.get_running_loop()
        start = loop.time()
        outputs = await collect(engine, prompt("hi"))
        return loop.time() - start, sum(len(o.token_ids) for o in outputs)

    elapsed, count = asyncio.run(timed())
    assert elapsed >= 0.05 + (count - 1) / 400 * 0.9


WEATHER = {"type": "function", "name": "get_weather", "description": "Weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "number"}},
                          "required": ["city"]}}


def calls_in(tokens):
    fragments = HarmonyStreamSplitter(encoding()).feed(tokens)
    started = [f for f in fragments if isinstance(f, MessageStarted)]
    return started, "".join(f.text for f in fragments if isinstance(f, TextDelta))


def test_offered_function_tools_are_called_with_required_arguments():
    request_facts = facts("Paris", tools=[WEATHER])
    assert request_facts.functions == {"get_weather": {"city": "string"}}
    started, text = calls_in(completion_tokens(encoding(), request_facts))
    assert started[-1].recipient == "functions.get_weather"
    assert text.endswith('{"city":"Paris"}')


def test_after_a_tool_result_it_answers():
    request_facts = read_prompt(encoding(), render_prompt(
        encoding(),
        CreateResponseRequest(model="m", tools=[WEATHER], input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny, 21C"},
        ]), 0).token_ids)
    assert request_facts.tool_result == "sunny, 21C"
    started, text = calls_in(completion_tokens(encoding(), request_facts))
    assert [s.channel for s in started] == ["analysis", "final"]
    assert text.endswith("Steno simulator reply: the tool returned sunny, 21C")


def test_tools_without_parameters_are_called_with_no_arguments():
    started, text = calls_in(completion_tokens(encoding(), facts("x", tools=[{"type": "function", "name": "ping"}])))
    assert started[-1].recipient == "functions.ping"
    assert text.endswith("{}")


def test_builtin_tools_are_called():
    started, _ = calls_in(completion_tokens(encoding(), facts("news", tools=[{"type": "web_search"}])))
    assert started[-1].recipient == "browser.search"
    started, _ = calls_in(completion_tokens(encoding(), facts("code", tools=[{"type": "code_interpreter"}])))
    assert started[-1].recipient == "python"
