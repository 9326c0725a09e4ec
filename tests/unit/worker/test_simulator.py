import asyncio

from schemas.bus import SamplingParams
from services.api.render import render_prompt
from schemas.api import CreateResponseRequest
from services.parser.harmony import HarmonyStreamSplitter, MessageStarted, TextDelta
from services.worker.simulator import SimulatorEngine, SimulatorTiming, completion_tokens, last_user_text
from tests.harmony_samples import encoding


def prompt(text: str) -> list[int]:
    return render_prompt(encoding(), CreateResponseRequest(model="m", input=text), 1700000000)


async def collect(engine, tokens, sampling=SamplingParams()):
    return [o async for o in engine.generate("r", tokens, sampling)]


def test_reads_the_last_user_message():
    assert last_user_text(encoding(), prompt("What is 2+2?")) == "What is 2+2?"


def test_completion_is_well_formed_harmony_with_reasoning_and_answer():
    tokens = completion_tokens(encoding(), "ping")
    fragments = HarmonyStreamSplitter(encoding()).feed(tokens)
    channels = [f.channel for f in fragments if isinstance(f, MessageStarted)]
    assert channels == ["analysis", "final"]
    text = "".join(f.text for f in fragments if isinstance(f, TextDelta))
    assert "ping" in text
    assert tokens[-1] == encoding().encode("<|return|>", allowed_special="all")[0]


def test_deterministic_in_the_input():
    assert completion_tokens(encoding(), "a") == completion_tokens(encoding(), "a")
    assert completion_tokens(encoding(), "a") != completion_tokens(encoding(), "b")


def test_streams_all_tokens_then_stops():
    engine = SimulatorEngine(encoding(), SimulatorTiming(chunk_tokens=5))
    outputs = asyncio.run(collect(engine, prompt("hello")))
    assert sum((o.token_ids for o in outputs), []) == completion_tokens(encoding(), "hello")
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
