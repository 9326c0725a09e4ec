"""Completion tokens -> fragments, for every family, under random batch splits, with the
simulator's byte tokenizer and with a trained BPE whose tokens span several characters
(and split multi-byte characters)."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steno.schemas.bus import ChatTemplateFiles
from steno.schemas.responses import ParseContext
from steno.services.dialects import MalformedOutput, MessageEnded, MessageStarted, TextDelta, chat_template_dialect
from steno.services.dialects.chat_template.families import FAMILIES
from steno.services.dialects.chat_template.files import files_for_family
from steno.services.dialects.chat_template.splitter import ChatTemplateSplitter, resolve_tool_name
from steno.services.dialects.chat_template.tool_calls import write_tool_calls
from steno.services.dialects.chat_template.vocabulary import IncrementalDecoder, trained_tokenizer

CORPUS = ["Déjà vu, 日本 🎉 the weather in Paris is sunny", "reasoning about the user's question " * 5,
          '{"name": "get_weather", "arguments": {"city": "Paris"}}', "Steno simulator reply: "] * 20


def files(family: str, trained: bool, markers_as_text: bool = False) -> ChatTemplateFiles:
    """``markers_as_text``: only the stop tokens are special; the family's other markers
    (tags, call markup) are spelled in ordinary tokens, as some models' are."""
    made = files_for_family(FAMILIES[family])
    if not trained:
        return made
    specials = made.stop_tokens if markers_as_text else FAMILIES[family].special_tokens
    tokenizer = trained_tokenizer(CORPUS, 600, specials)
    return made.model_copy(update={"tokenizer": tokenizer.to_str()})


def messages(fragments) -> list:
    """[(channel, recipient, text)] and malformed details, as the parser would see them."""
    out: list = []
    open_message = None
    for fragment in fragments:
        if isinstance(fragment, MessageStarted):
            open_message = [fragment.channel, fragment.recipient, ""]
        elif isinstance(fragment, TextDelta):
            open_message[2] += fragment.text
        elif isinstance(fragment, MessageEnded):
            out.append(tuple(open_message))
            open_message = None
        elif isinstance(fragment, MalformedOutput):
            out.append(("malformed", fragment.detail))
    assert open_message is None
    return out


def split_feed(splitter, tokens, cuts) -> list:
    fragments = []
    start = 0
    for cut in [*sorted({c % (len(tokens) + 1) for c in cuts}), len(tokens)]:
        fragments += splitter.feed(tokens[start:cut])
        start = max(start, cut)
    return fragments + splitter.finish()


def completion(dialect, text: str) -> list[int]:
    return dialect.tokenizer.encode(text + dialect.model_files.stop_tokens[0], add_special_tokens=False).ids


def context(dialect, **fields) -> ParseContext:
    return ParseContext(dialect="chat_template", dialect_files=dialect.files, **fields)


CASES = {
    "qwen3": ("<think>\nLet me see: 日本.\n</think>\n\nIt is <b>sunny</b> 🎉\n<tool_call>\n"
              '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
              '{"name": "get_weather", "arguments": {"city": "Déjà"}}\n</tool_call>'),
    "deepseek": ("<think>\nLet me see: 日本.\n</think>\n\nIt is sunny 🎉"
                 + write_tool_calls("deepseek_v3", [("get_weather", {"city": "Paris"})])),
    "hermes": ('It is sunny 🎉\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    "llama3": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "mistral": 'It is sunny 🎉[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
}
EXPECTED_CALLS = {"qwen3": ["Paris", "Déjà"]}


@pytest.mark.parametrize("trained", [False, True], ids=["bytes", "trained"])
@pytest.mark.parametrize("family", sorted(CASES))
def test_a_completion_splits_into_reasoning_answer_and_calls_however_it_is_batched(family, trained):
    dialect = chat_template_dialect(files(family, trained))
    tokens = completion(dialect, CASES[family])
    whole = messages(split_feed(dialect.splitter(context(dialect, function_tools=["get_weather"])), tokens, []))

    reasoning = [text for channel, _, text in whole if channel == "analysis"]
    answer = "".join(text for channel, _, text in whole if channel == "final")
    calls = [(recipient, text) for channel, recipient, text in whole if channel == "commentary"]
    assert reasoning == (["Let me see: 日本."] if family in ("qwen3", "deepseek") else [])
    assert answer == ("" if family == "llama3" else "It is <b>sunny</b> 🎉" if family == "qwen3" else "It is sunny 🎉")
    cities = EXPECTED_CALLS.get(family, ["Paris"])
    assert calls == [("functions.get_weather", f'{{"city": "{city}"}}') for city in cities]

    @settings(max_examples=40, deadline=None)
    @given(st.lists(st.integers(min_value=0, max_value=len(tokens)), max_size=12))
    def any_batching(cuts):
        splitter = dialect.splitter(context(dialect, function_tools=["get_weather"]))
        assert messages(split_feed(splitter, tokens, cuts)) == whole

    any_batching()


def token_by_token(dialect, parse_context) -> ChatTemplateSplitter:
    """The splitter with nothing read in runs: each token decoded in its window and parsed
    by itself."""
    files = dialect.model_files
    return ChatTemplateSplitter(IncrementalDecoder(dialect.tokenizer), frozenset(dialect.stop_token_ids),
                                parse_context, files.reasoning_tags, files.tool_call_format)


# Prose, markers of every family, markup's first characters alone, characters of several bytes.
PARTS = st.sampled_from([
    " the weather", " in Paris", " is", "sunny", ".", "\n", "\n\n", "  ", "Déjà", " 日本", " 🎉", "<", "[", "{", "}",
    "<b>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<function=get_weather>", "</function>",
    "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    write_tool_calls("deepseek_v3", [("get_weather", {"city": "Paris"})]),
])


@pytest.mark.parametrize(("trained", "markers_as_text"), [(False, False), (True, False), (True, True)],
                         ids=["bytes", "trained", "markers as text"])
@pytest.mark.parametrize("family", sorted(CASES))
def test_runs_read_what_token_by_token_reads(family, trained, markers_as_text):
    """Whatever the output and its batches: the same messages, the same reasoning tokens,
    and each delta names tokens of the batch that produced it."""
    dialect = chat_template_dialect(files(family, trained, markers_as_text))

    @settings(max_examples=60, deadline=None)
    @given(parts=st.lists(PARTS, max_size=16), opened=st.booleans(), tools=st.booleans(), data=st.data())
    def any_output(parts, opened, tools, data):
        tokens = completion(dialect, "".join(parts))
        parse_context = context(dialect, reasoning_open=opened, function_tools=["get_weather"] if tools else [])
        reference = token_by_token(dialect, parse_context)
        expected = [*[f for token in tokens for f in reference.feed([token])], *reference.finish()]
        cuts = data.draw(st.lists(st.integers(0, len(tokens)), max_size=8))
        splitter = dialect.splitter(parse_context)
        fragments, start = [], 0
        for cut in [*sorted(set(cuts)), len(tokens)]:
            fed = splitter.feed(tokens[start:cut])
            assert all(f.token_index + f.token_count <= max(cut - start, 1) for f in fed if isinstance(f, TextDelta))
            fragments += fed
            start = cut
        fragments += splitter.finish()
        assert messages(fragments) == messages(expected)
        assert splitter.reasoning_tokens == reference.reasoning_tokens

    any_output()


def test_a_run_of_known_tokens_is_one_delta_naming_them_all():
    dialect = chat_template_dialect(files("qwen3", True))
    answer = " the weather in Paris is sunny the weather in Paris is sunny"
    tokens = completion(dialect, "<think>\nreasoning about the user's question\n</think>\n\nDéjà vu," + answer)
    splitter = dialect.splitter(context(dialect))
    deltas = [f for f in splitter.feed(tokens) if isinstance(f, TextDelta)]
    last = deltas[-1]
    # The answer's last tokens, up to the stop token, are read in one piece.
    assert last.token_index + last.token_count == len(tokens) - 1
    assert last.token_count > 5 and last.text.endswith(answer)
    assert splitter.reasoning_tokens == token_by_token_reasoning(dialect, tokens)
    assert len(deltas) < len(tokens) / 3


def test_text_before_a_call_names_none_of_the_call_s_tokens():
    """Markup spelled in ordinary tokens ends a run, so that the answer's logprobs are
    the answer's tokens'."""
    dialect = chat_template_dialect(files("hermes", True, markers_as_text=True))
    tokens = completion(dialect, 'It is sunny.\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>')
    markup = next(index for index, token in enumerate(tokens) if "<" in dialect.token_text(token))
    fragments = dialect.splitter(context(dialect, function_tools=["get_weather"])).feed(tokens)
    answer = fragments[:fragments.index(MessageEnded())]
    assert messages([*answer, MessageEnded()]) == [("final", None, "It is sunny.")]
    assert max(f.token_index + f.token_count for f in answer if isinstance(f, TextDelta)) <= markup


def token_by_token_reasoning(dialect, tokens) -> int:
    reference = token_by_token(dialect, context(dialect))
    for token in tokens:
        reference.feed([token])
    return reference.reasoning_tokens


@pytest.mark.parametrize("family", sorted(CASES))
def test_with_no_tools_offered_markup_is_the_answer(family):
    dialect = chat_template_dialect(files(family, False))
    text = 'Use <tool_call>{"name": "x"}</tool_call> or [TOOL_CALLS] as you like.'
    got = messages(split_feed(dialect.splitter(context(dialect)), completion(dialect, text), []))
    assert [channel for channel, *_ in got] == ["final"]
    assert "<tool_call>" in got[0][2] or "[TOOL_CALLS]" in got[0][2]


def test_markup_held_back_at_max_tokens_is_released_at_the_end():
    dialect = chat_template_dialect(files("hermes", False))
    tokens = dialect.tokenizer.encode("Nearly a <tool_ca", add_special_tokens=False).ids  # no stop token
    splitter = dialect.splitter(context(dialect, function_tools=["get_weather"]))
    fed = splitter.feed(tokens)
    # The rest may be a call (and the space before it not the answer's).
    assert "".join(f.text for f in fed if isinstance(f, TextDelta)) == "Nearly a"
    assert messages([*fed, *splitter.finish()]) == [("final", None, "Nearly a <tool_ca")]


def test_a_call_with_broken_arguments_ends_the_output_as_malformed():
    dialect = chat_template_dialect(files("hermes", False))
    text = 'Calling.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>then more'
    got = messages(split_feed(dialect.splitter(context(dialect, function_tools=["get_weather"])),
                              completion(dialect, text), []))
    assert got[0] == ("final", None, "Calling.")
    assert got[1][0] == "malformed" and len(got) == 2


def test_reasoning_tokens_are_counted():
    dialect = chat_template_dialect(files("qwen3", False))
    splitter = dialect.splitter(context(dialect))
    tokens = completion(dialect, "<think>\nabc\n</think>\n\nxyz")
    splitter.feed(tokens)
    # The reasoning block's tokens (tags and text), not the answer's.
    assert len(dialect.tokenizer.encode("<think>\nabc\n</think>", add_special_tokens=False).ids) - 1 <= \
        splitter.reasoning_tokens <= len(tokens) - len("xyz")


def test_a_prompt_that_opened_the_reasoning_block_starts_the_output_inside_it():
    dialect = chat_template_dialect(files("deepseek", False))
    got = messages(split_feed(dialect.splitter(context(dialect, reasoning_open=True)),
                              completion(dialect, "thinking first</think>\n\nthe answer"), []))
    assert got == [("analysis", None, "thinking first"), ("final", None, "the answer")]


@pytest.mark.parametrize(("written", "resolved"), [
    ("get_weather", "get_weather"), ("functions.get_weather", "get_weather"), ("find_user", "crm.find_user"),
    ("crm.find_user", "crm.find_user"), ("crm__find_user", "crm.find_user"), ("unknown", "unknown"),
    ("lookup", "lookup"),
])
def test_tool_names_resolve_to_the_offered_tool_they_mean(written, resolved):
    offered = ["get_weather", "crm.find_user", "a.lookup", "b.lookup"]
    assert resolve_tool_name(written, offered) == resolved


def test_the_files_digest_names_their_content():
    made = files_for_family(FAMILIES["qwen3"])
    assert made.digest() == files_for_family(FAMILIES["qwen3"]).digest()
    assert dataclasses.replace(FAMILIES["qwen3"], tool_call_format="qwen3_coder") != FAMILIES["qwen3"]
    assert made.model_copy(update={"tool_call_format": "qwen3_coder"}).digest() != made.digest()
