"""The vLLM engine's request mapping without a running engine: the Harmony grammar for
``text.format`` (checked with xgrammar itself, token by token), logprob conversion and
sampling parameters. The logprob test needs neither vLLM nor xgrammar and also runs in
the main environment; the others skip there."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from steno.services.dialects.chat_template.grammar import answer_grammar as chat_template_answer_grammar
from steno.services.dialects.harmony.grammar import final_json_tag, json_format
from steno.services.dialects.harmony.vocabulary import harmony_encoding
from steno.services.worker.vllm_engine import LOGPROB_FLOOR, convert_logprobs

SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green"]}, "note": {"type": "string"}},
    "required": ["color", "note"],
    "additionalProperties": False,
}


@dataclass
class Logprob:  # the shape of vLLM's vllm.logprobs.Logprob
    logprob: float
    rank: int | None
    decoded_token: str | None = None


def test_logprobs_are_the_sampled_token_and_the_top_n_by_rank():
    steps = [
        {7: Logprob(-3.0, 5), 1: Logprob(-0.5, 1), 2: Logprob(-1.0, 2)},  # sampled outside the top 2
        {1: Logprob(-0.2, 1), 2: Logprob(-2.0, 2)},  # sampled is the top one
        {9: Logprob(float("-inf"), 9000), 1: Logprob(-0.1, 1), 2: Logprob(-3.0, 2)},
    ]
    sampled, top = convert_logprobs([7, 1, 9], steps, 2)
    assert sampled == [-3.0, -0.2, LOGPROB_FLOOR]
    assert top == [[(1, -0.5), (2, -1.0)], [(1, -0.2), (2, -2.0)], [(1, -0.1), (2, -3.0)]]
    sampled, top = convert_logprobs([7, 1], steps[:2], 0)
    assert sampled == [-3.0, -0.2] and top is None
    # Missing entries keep the lists aligned with the tokens.
    sampled, top = convert_logprobs([4, 5], [], 1)
    assert sampled == [LOGPROB_FLOOR, LOGPROB_FLOOR] and top == [[], []]


@pytest.fixture(scope="module")
def matcher_for(tmp_path_factory):
    xgr = pytest.importorskip("xgrammar")
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from steno.infra.tiny_model import build_harmony_tokenizer

    directory = build_harmony_tokenizer(tmp_path_factory.mktemp("harmony-tokenizer"))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    stops = harmony_encoding().stop_tokens_for_assistant_actions()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=201088, stop_token_ids=stops)
    compiler = xgr.GrammarCompiler(info)

    def make(tag: dict):
        import json

        return xgr.GrammarMatcher(compiler.compile_structural_tag(json.dumps(tag)))

    return make


def accepts(matcher, tokens: list[int]) -> bool:
    return all(matcher.accept_token(t) for t in tokens)


def encode(text: str) -> list[int]:
    """Special tokens as special tokens; text between backticks as ordinary tokens."""
    tokens: list[int] = []
    for index, part in enumerate(text.split("`")):
        if index % 2:
            tokens += harmony_encoding().encode(part, disallowed_special=())
        else:
            tokens += harmony_encoding().encode(part, allowed_special="all")
    return tokens


ANSWER = '{"color": "red", "note": "fine"}'


@pytest.mark.vllm
@pytest.mark.parametrize(
    "completion",
    [
        f"<|channel|>final <|constrain|>json<|message|>{ANSWER}<|return|>",
        f"<|channel|>final json<|message|>{ANSWER}<|return|>",
        f"<|channel|>analysis<|message|>Think `<|end|>` first.<|end|><|start|>assistant"
        f"<|channel|>final json<|message|>{ANSWER}<|return|>",
    ],
)
def test_the_grammar_accepts_reasoning_then_a_json_final_message(matcher_for, completion):
    matcher = matcher_for(final_json_tag(SCHEMA, None))
    tokens = encode(completion)
    # The analysis text above spells "<|end|>" with ordinary tokens: that is just text.
    assert accepts(matcher, tokens)
    assert matcher.is_terminated()


@pytest.mark.vllm
@pytest.mark.parametrize(
    "completion",
    [
        ANSWER,  # no Harmony header
        '<|channel|>final json<|message|>{"color": "blue", "note": "x"}',  # not in the enum
        '<|channel|>final json<|message|>{"color": "red", "note": "a<|end|>"}',  # special token in a string
        f"<|channel|>commentary<|message|>hi<|end|><|start|>assistant<|channel|>final json<|message|>{ANSWER}",
        f"<|channel|>final json<|message|>{ANSWER}<|end|>",  # <|end|> then <|return|> is not Harmony
    ],
)
def test_the_grammar_rejects_what_is_not_a_harmony_json_answer(matcher_for, completion):
    matcher = matcher_for(final_json_tag(SCHEMA, None))
    assert not accepts(matcher, encode(completion))


@pytest.mark.vllm
def test_the_grammar_wants_special_tokens_not_their_spelling(matcher_for):
    matcher = matcher_for(final_json_tag(SCHEMA, None))
    spelled = encode("`<|channel|>`")  # ordinary tokens
    assert len(spelled) > 1
    assert not matcher.accept_token(spelled[0])
    assert matcher.accept_token(encode("<|channel|>")[0])


@pytest.mark.vllm
def test_the_whitespace_bound_holds_inside_json(matcher_for):
    tag = {"type": "structural_tag", "format": json_format(SCHEMA, 2)}
    assert accepts(matcher_for(tag), encode('{ "color":  "red", "note": "x"}'))
    assert not accepts(matcher_for(tag), encode('{   "color": "red", "note": "x"}'))


@pytest.mark.vllm
def test_sampling_params_map_every_field(tmp_path):
    pytest.importorskip("vllm")
    from vllm.sampling_params import RequestOutputKind

    from steno.schemas.bus import SamplingParams, StructuredOutput
    from steno.services.worker.engine import EngineError
    from steno.services.worker.vllm_engine import VllmEngine, VllmOptions

    engine = VllmEngine(None, VllmOptions(model_path="/nonexistent", tokenizer="/tok"))
    params = engine.sampling_params(
        SamplingParams(
            max_tokens=9, temperature=0.5, top_p=0.9, top_logprobs=4, seed=3, stop_token_ids=[200002, 200012],
            structured_output=StructuredOutput(kind="json_schema", json_schema=SCHEMA),
        )
    )
    assert (params.max_tokens, params.temperature, params.top_p, params.logprobs, params.seed) == (9, 0.5, 0.9, 4, 3)
    assert params.stop_token_ids == [200002, 200012]
    assert params.output_kind == RequestOutputKind.DELTA and params.detokenize is False
    assert "json_schema" in params.structured_outputs.structural_tag
    defaults = engine.sampling_params(SamplingParams())
    assert (defaults.max_tokens, defaults.temperature, defaults.top_p, defaults.logprobs) == (None, 1.0, 1.0, None)
    # Without a tokenizer, structured outputs are refused per request.
    bare = VllmEngine(None, VllmOptions(model_path=str(tmp_path)))  # a model directory without a tokenizer
    with pytest.raises(EngineError, match="tokenizer"):
        bare.sampling_params(SamplingParams(structured_output=StructuredOutput(kind="json_object")))


@pytest.fixture(scope="module")
def qwen3_matcher_for(tmp_path_factory):
    """Matchers over the tiny Qwen3's tokenizer (the qwen3 family's markers, bytes)."""
    xgr = pytest.importorskip("xgrammar")
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from steno.infra.tiny_model import build_tiny_qwen3

    directory = build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3-grammar"))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer),
                                              stop_token_ids=[tokenizer.convert_tokens_to_ids("<|im_end|>")])
    compiler = xgr.GrammarCompiler(info)

    def make(scope: str):
        import json

        tag = chat_template_answer_grammar(SCHEMA, scope, None, ("<think>", "</think>"))
        return xgr.GrammarMatcher(compiler.compile_structural_tag(json.dumps(tag))), tokenizer

    return make


@pytest.mark.vllm
@pytest.mark.parametrize(("scope", "completion", "accepted"), [
    ("final", f"<think>\nLet me think.\n</think>\n\n{ANSWER}", True),
    ("final", f"Already thinking (the prompt opened the block).</think>{ANSWER}", True),
    ("final", f"</think>{ANSWER}", True),
    ("final", ANSWER, False),  # the reasoning block must close first: this is still reasoning
    ("final", '<think>x</think>{"color": "blue", "note": "x"}', False),
    ("whole", ANSWER, True),
    ("whole", f"<think>x</think>{ANSWER}", False),
])
def test_a_chat_template_models_grammar_frees_the_reasoning_block_and_constrains_the_answer(
        qwen3_matcher_for, scope, completion, accepted):
    matcher, tokenizer = qwen3_matcher_for(scope)
    tokens = tokenizer.encode(completion, add_special_tokens=False)
    # A whole completion: every token allowed, then the end of the turn.
    complete = accepts(matcher, tokens) and (
        matcher.is_terminated() or matcher.accept_token(tokenizer.convert_tokens_to_ids("<|im_end|>")))
    assert complete == accepted
