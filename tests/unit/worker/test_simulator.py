import asyncio

from steno.schemas.api import CreateResponseRequest
from steno.schemas.bus import SamplingParams
from steno.schemas.responses import ParseContext
from steno.services.dialects import MessageStarted, TextDelta
from steno.services.worker.simulator import SimulatorEngine, SimulatorTiming, completion_tokens
from tests.harmony_samples import encoding, harmony


def prompt(text: str, **request) -> list[int]:
    return harmony().render(CreateResponseRequest(model="m", input=text, **request), 1700000000).token_ids


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


def test_tools_without_parameters_are_called_with_no_arguments():
    started, text = calls_in(simulated("x", tools=[{"type": "function", "name": "ping"}]))
    assert started[-1].recipient == "functions.ping"
    assert text.endswith("{}")


def test_built_in_tools_are_not_called_they_are_not_offered():
    started, text = calls_in(simulated("news", tools=[{"type": "web_search"}, {"type": "code_interpreter"}]))
    assert [s.recipient for s in started] == [None, None]
    assert text.endswith("Steno simulator reply: news")
