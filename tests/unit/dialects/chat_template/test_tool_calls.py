import itertools
import json
import time

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from steno.services.dialects.chat_template.tool_calls import (
    DEEPSEEK_CALL_BEGIN,
    DEEPSEEK_CALL_END,
    DEEPSEEK_CALLS_BEGIN,
    DEEPSEEK_CALLS_END,
    DEEPSEEK_SEP,
    TOOL_CALL_FORMATS,
    Malformed,
    Text,
    ToolCall,
    convert_parameter,
    tool_call_parser,
    write_tool_calls,
)

NON_ASCII = "Déjà vu, 日本 🎉"


def run(format, chunks, parameter_types=None):
    parser = tool_call_parser(format, parameter_types)
    pieces = []
    for chunk in chunks:
        pieces += parser.feed(chunk)
    return merged(pieces + parser.finish())


def merged(pieces):
    """The pieces with neighbouring texts joined: what a reader of the stream sees."""
    out = []
    for piece in pieces:
        if isinstance(piece, Text) and out and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].text + piece.text)
        else:
            out.append(piece)
    return out


def call(name, **arguments):
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False))


def split(text, cuts):
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def single_characters(text):
    return list(text)


def is_malformed(pieces):
    return any(isinstance(piece, Malformed) for piece in pieces)


# -- hermes ---------------------------------------------------------------------------

HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_hermes_content_only():
    assert run("hermes", ["Just an answer, no calls.\n"]) == [Text("Just an answer, no calls.\n")]


def test_hermes_one_call():
    assert run("hermes", [HERMES_CALL]) == [call("get_weather", city="Paris")]


def test_hermes_parallel_calls_with_content_around():
    text = f"Let me check.\n\n{HERMES_CALL}\n{HERMES_CALL.replace('Paris', 'Oslo')}\n\nDone."
    assert run("hermes", [text]) == [
        Text("Let me check."),
        call("get_weather", city="Paris"),
        call("get_weather", city="Oslo"),
        Text("Done."),
    ]


def test_hermes_non_ascii():
    text = f'{NON_ASCII}<tool_call>{{"name": "crm.find_user", "arguments": {{"q": "{NON_ASCII}"}}}}</tool_call>'
    assert run("hermes", single_characters(text)) == [Text(NON_ASCII), call("crm.find_user", q=NON_ASCII)]


def test_hermes_marker_split_across_feeds():
    parser = tool_call_parser("hermes")
    assert parser.feed("Sure <tool_") == [Text("Sure")]
    assert parser.feed('call>{"name": "f", "arguments": {}}</tool') == []
    assert parser.feed("_call>") == [ToolCall("f", "{}")]
    assert parser.finish() == []


def test_hermes_marker_prefix_that_is_not_a_marker():
    parser = tool_call_parser("hermes")
    assert parser.feed("a <tool_") == [Text("a")]
    assert parser.feed("box> b") == [Text(" <tool_box> b")]
    assert parser.feed(" <") == []
    assert merged(parser.finish()) == [Text(" <")]


def test_hermes_call_is_emitted_as_soon_as_it_ends():
    parser = tool_call_parser("hermes")
    assert parser.feed(HERMES_CALL) == [call("get_weather", city="Paris")]


def test_hermes_accepts_parameters_and_arguments_encoded_as_a_string():
    text = '<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>'
    text += '<tool_call>{"name": "g", "arguments": "{\\"b\\": 2}"}</tool_call>'
    assert run("hermes", [text]) == [call("f", a=1), call("g", b=2)]


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "f", "arguments": {"a": }}',  # bad JSON
        '{"arguments": {}}',  # no name
        '{"name": "f"}',  # no arguments
        '{"name": "f", "arguments": [1]}',  # arguments not an object
        '["f", {}]',  # not an object
        '{"name": "f", "arguments": {"x": NaN}}',  # not JSON for any client
    ],
)
def test_hermes_unreadable_call_is_malformed(body):
    pieces = run("hermes", [f"Hi <tool_call>{body}</tool_call> after"])
    assert pieces[0] == Text("Hi")
    assert isinstance(pieces[1], Malformed)
    assert pieces[2] == Text("after")


def test_hermes_unterminated_call_at_finish_is_malformed():
    pieces = run("hermes", ['Hi <tool_call>{"name": "f", "arguments": {}}</tool_ca'])
    assert pieces[0] == Text("Hi")
    assert isinstance(pieces[1], Malformed) and "unterminated" in pieces[1].detail


# -- llama3_json ----------------------------------------------------------------------


def test_llama3_content_only_streams():
    parser = tool_call_parser("llama3_json")
    assert parser.feed("Hello") == [Text("Hello")]
    assert parser.feed(' {"name": "f", "parameters": {}}') == [Text(' {"name": "f", "parameters": {}}')]
    assert parser.finish() == []


def test_llama3_one_call_is_held_until_finish():
    parser = tool_call_parser("llama3_json")
    assert parser.feed('{"name": "get_weather", "parameters": {"city": "Paris"}}') == []
    assert parser.finish() == [call("get_weather", city="Paris")]


def test_llama3_python_tag_arguments_and_parallel_calls():
    text = '\n<|python_tag|>{"name": "f", "arguments": {"a": 1}}; {"name": "g", "parameters": {"b": [2]}}\n'
    assert run("llama3_json", [text]) == [call("f", a=1), call("g", b=[2])]


def test_llama3_non_ascii():
    text = f'{{"name": "crm.find_user", "parameters": {{"q": "{NON_ASCII}"}}}}'
    assert run("llama3_json", single_characters(text)) == [call("crm.find_user", q=NON_ASCII)]


def test_llama3_python_tag_split_across_feeds():
    assert run("llama3_json", ["<|pyth", 'on_tag|>{"name": "f", "parameters": {}}']) == [ToolCall("f", "{}")]


def test_llama3_prefix_of_python_tag_that_is_not_one_is_text():
    parser = tool_call_parser("llama3_json")
    assert parser.feed("  <|pyt") == []
    assert parser.feed("hon|> is a tag") == [Text("  <|python|> is a tag")]
    assert run("llama3_json", ["<|py"]) == [Text("<|py")]


@pytest.mark.parametrize(
    "answer",
    [
        '{"answer": 42}',
        '{"name": "Bob", "age": 3}',
        '{"name": "f", "parameters": "not an object"}',
        '{"name": 7, "parameters": {}}',
        '{"name": "f", "parameters": {}} and some words',
        '{"truncated": ',
        '[{"name": "f", "parameters": {}}]',
    ],
)
def test_llama3_json_answer_that_is_not_a_call_stays_text(answer):
    assert run("llama3_json", [answer]) == [Text(answer)]


def test_llama3_python_tag_without_calls_is_malformed():
    pieces = run("llama3_json", ['<|python_tag|>brave_search.call(query="x")'])
    assert len(pieces) == 1 and isinstance(pieces[0], Malformed)


# -- mistral --------------------------------------------------------------------------


def test_mistral_content_only():
    assert run("mistral", ["An [answer] with [TOOLS] in it"]) == [Text("An [answer] with [TOOLS] in it")]


def test_mistral_v11_call_is_emitted_as_soon_as_its_json_ends():
    parser = tool_call_parser("mistral")
    assert parser.feed("Checking. [TOOL_CALLS]get_weather[ARGS]") == [Text("Checking.")]
    assert parser.feed('{"city": "Paris", "note": "}]\\"{"') == []
    assert parser.feed("}") == [call("get_weather", city="Paris", note='}]"{')]
    assert parser.finish() == []


def test_mistral_v11_parallel_calls_and_text_after():
    text = '[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]crm.find_user[ARGS] {"q": "x"}\n\nDone.'
    assert run("mistral", [text]) == [call("f", a=1), call("crm.find_user", q="x"), Text("Done.")]


def test_mistral_pre_v11_array_and_bare_object():
    text = 'Hi [TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]'
    assert run("mistral", [text]) == [Text("Hi"), call("f", a=1), ToolCall("g", "{}")]
    assert run("mistral", ['[TOOL_CALLS]{"name": "f", "arguments": {"a": 1}}']) == [call("f", a=1)]


def test_mistral_name_then_brace_without_args_marker():
    assert run("mistral", ['[TOOL_CALLS]f{"a": 1}']) == [call("f", a=1)]


def test_mistral_repeated_marker_counts_once():
    assert run("mistral", ['[TOOL_CALLS][TOOL_CALLS]f[ARGS]{"a": 1}']) == [call("f", a=1)]


def test_mistral_non_ascii():
    text = f'{NON_ASCII} [TOOL_CALLS]crm.find_user[ARGS]{{"q": "{NON_ASCII}"}}'
    assert run("mistral", single_characters(text)) == [Text(NON_ASCII), call("crm.find_user", q=NON_ASCII)]


def test_mistral_markers_split_across_feeds():
    chunks = ["a [TOOL_", "CALLS]f[AR", 'GS]{"x"', ": 1", "}"]
    assert run("mistral", chunks) == [Text("a"), call("f", x=1)]


def test_mistral_marker_prefix_that_is_not_a_marker():
    parser = tool_call_parser("mistral")
    assert parser.feed("see [TOOL") == [Text("see")]
    assert parser.feed("S]") == [Text(" [TOOLS]")]
    assert parser.feed(" [TOOL_CALL") == []
    assert merged(parser.finish()) == [Text(" [TOOL_CALL")]


@pytest.mark.parametrize(
    "text",
    [
        '[TOOL_CALLS]f[ARGS]{"a": }',  # bad JSON
        '[TOOL_CALLS]f[ARGS]["a"]',  # arguments not an object
        '[TOOL_CALLS][ARGS]{"a": 1}',  # no name
        '[TOOL_CALLS][{"name": "f"}]',  # no arguments
        "[TOOL_CALLS][]",
        '[TOOL_CALLS]f[ARGS]"text"',
    ],
)
def test_mistral_unreadable_call_is_malformed(text):
    assert is_malformed(run("mistral", [text]))


@pytest.mark.parametrize("text", ['[TOOL_CALLS]f[ARGS]{"a": 1', "[TOOL_CALLS]f", "[TOOL_CALLS]", "[TOOL_CALLS]  "])
def test_mistral_unterminated_call_at_finish_is_malformed(text):
    pieces = run("mistral", [text])
    assert len(pieces) == 1 and isinstance(pieces[0], Malformed)


# -- qwen3_coder ----------------------------------------------------------------------

QWEN_CALL = """<tool_call>
<function=get_weather>
<parameter=city>
Paris
</parameter>
<parameter=days>
3
</parameter>
</function>
</tool_call>"""


def test_qwen3_coder_content_only():
    assert run("qwen3_coder", ["a < b and <b>bold</b>"]) == [Text("a < b and <b>bold</b>")]


def test_qwen3_coder_one_call_typed_and_untyped():
    assert run("qwen3_coder", [QWEN_CALL]) == [call("get_weather", city="Paris", days=3)]
    types = {"get_weather": {"city": "string", "days": "string"}}
    assert run("qwen3_coder", [QWEN_CALL], types) == [call("get_weather", city="Paris", days="3")]


def test_qwen3_coder_parallel_calls_with_content_around():
    text = f"I will look.\n{QWEN_CALL}\n{QWEN_CALL.replace('Paris', NON_ASCII)}\nThat is all."
    assert run("qwen3_coder", single_characters(text)) == [
        Text("I will look."),
        call("get_weather", city="Paris", days=3),
        call("get_weather", city=NON_ASCII, days=3),
        Text("That is all."),
    ]


def test_qwen3_coder_multiline_values_keep_inner_newlines():
    text = "<tool_call>\n<function=write>\n<parameter=body>\n\nline 1\nline 2\n\n</parameter>\n"
    text += "</function>\n</tool_call>"
    assert run("qwen3_coder", [text], {"write": {"body": "string"}}) == [call("write", body="\nline 1\nline 2\n")]


def test_qwen3_coder_lenient_markup():
    # A parameter without its closing tag ends where the next begins; a function without
    # <tool_call> around it is still a call.
    text = "<function=f>\n<parameter=a>\n1\n<parameter=b>\nx\n</function>"
    assert run("qwen3_coder", [text]) == [call("f", a=1, b="x")]


def test_qwen3_coder_object_that_does_not_parse_stays_text():
    text = "<tool_call><function=f><parameter=a>{not json}</parameter></function></tool_call>"
    assert run("qwen3_coder", [text], {"f": {"a": "object"}}) == [call("f", a="{not json}")]


def test_qwen3_coder_unreadable_call_is_malformed():
    assert is_malformed(run("qwen3_coder", ["<tool_call>\n{not xml}\n</tool_call>"]))
    assert is_malformed(run("qwen3_coder", ["<tool_call><function=>\n</function></tool_call>"]))


def test_qwen3_coder_unterminated_call_at_finish_is_malformed():
    pieces = run("qwen3_coder", ["Hi\n" + QWEN_CALL[:-3]])
    assert pieces[0] == Text("Hi") and isinstance(pieces[1], Malformed)


@pytest.mark.parametrize(
    ("value", "schema_type", "expected"),
    [
        ("42", "string", "42"),
        (" 42 ", "integer", 42),
        ("4.0", "integer", 4),
        ("4.5", "integer", 4.5),
        ("forty", "integer", "forty"),
        ("1e3", "number", 1000.0),
        ("NaN", "number", "NaN"),
        ("true", "integer", "true"),
        ("True", "boolean", True),
        ("false", "boolean", False),
        ("yes", "boolean", "yes"),
        ("0", "boolean", False),
        ('{"a": [1]}', "object", {"a": [1]}),
        ("[1]", "object", "[1]"),
        ("[1, 2]", "array", [1, 2]),
        ("[1, ", "array", "[1, "),
        ("null", "null", None),
        ("Paris", None, "Paris"),
        ("12", None, 12),
        ('"quoted"', None, '"quoted"'),
        ("null", None, None),
        ("{}", "unknown-type", {}),
    ],
)
def test_qwen3_coder_parameter_conversion(value, schema_type, expected):
    assert convert_parameter(value, schema_type) == expected
    assert type(convert_parameter(value, schema_type)) is type(expected)


# -- deepseek_v3 ----------------------------------------------------------------------


def deepseek_v3_call(name, arguments):
    return f"{DEEPSEEK_CALL_BEGIN}function{DEEPSEEK_SEP}{name}\n```json\n{arguments}\n```{DEEPSEEK_CALL_END}"


def test_deepseek_content_only():
    text = "Plain answer <\uff5cnot a marker\uff5c>"
    assert run("deepseek_v3", [text]) == [Text(text)]


def test_deepseek_v3_parallel_calls_with_content_around():
    first = deepseek_v3_call("f", '{"a": 1}')
    second = deepseek_v3_call("crm.find_user", json.dumps({"q": NON_ASCII}, indent=2, ensure_ascii=False))
    text = f"Looking.\n{DEEPSEEK_CALLS_BEGIN}{first}\n{second}{DEEPSEEK_CALLS_END}\nDone."
    expected = [Text("Looking."), call("f", a=1), call("crm.find_user", q=NON_ASCII), Text("Done.")]
    assert run("deepseek_v3", [text]) == expected
    assert run("deepseek_v3", single_characters(text)) == expected


def test_deepseek_v31_form():
    text = f'{DEEPSEEK_CALLS_BEGIN}{DEEPSEEK_CALL_BEGIN}get_weather{DEEPSEEK_SEP}{{"city": "Paris"}}{DEEPSEEK_CALL_END}'
    text += f"{DEEPSEEK_CALL_BEGIN}g{DEEPSEEK_SEP}{{}}{DEEPSEEK_CALL_END}{DEEPSEEK_CALLS_END}"
    assert run("deepseek_v3", [text]) == [call("get_weather", city="Paris"), ToolCall("g", "{}")]


def test_deepseek_call_is_emitted_when_its_end_marker_arrives():
    parser = tool_call_parser("deepseek_v3")
    assert parser.feed(DEEPSEEK_CALLS_BEGIN + deepseek_v3_call("f", "{}")[:-3]) == []
    assert parser.feed(DEEPSEEK_CALL_END[-3:]) == [ToolCall("f", "{}")]
    assert parser.feed(DEEPSEEK_CALLS_END) == []
    assert parser.finish() == []


def test_deepseek_marker_prefix_that_is_not_a_marker():
    parser = tool_call_parser("deepseek_v3")
    assert parser.feed("x <\uff5ctool\u2581ca") == [Text("x")]
    assert parser.feed("t\uff5c>") == [Text(" <\uff5ctool\u2581cat\uff5c>")]


@pytest.mark.parametrize(
    "body",
    [
        'function<\uff5ctool\u2581sep\uff5c>f\n```json\n{"a": }\n```',  # bad JSON
        "function<\uff5ctool\u2581sep\uff5c>f\n```json\n[1]\n```",  # not an object
        'f{"a": 1}',  # no separator
        "function<\uff5ctool\u2581sep\uff5c>f\n{no fence}",
        '<\uff5ctool\u2581sep\uff5c>{"a": 1}',  # no name
    ],
)
def test_deepseek_unreadable_call_is_malformed(body):
    text = f"{DEEPSEEK_CALLS_BEGIN}{DEEPSEEK_CALL_BEGIN}{body}{DEEPSEEK_CALL_END}{DEEPSEEK_CALLS_END}"
    pieces = run("deepseek_v3", [text])
    assert len(pieces) == 1 and isinstance(pieces[0], Malformed)


def test_deepseek_unterminated_call_at_finish_is_malformed():
    pieces = run("deepseek_v3", [f"{DEEPSEEK_CALLS_BEGIN}{deepseek_v3_call('f', '{}')[:-5]}"])
    assert len(pieces) == 1 and isinstance(pieces[0], Malformed)


# -- every format ---------------------------------------------------------------------


def test_unknown_format_is_refused():
    with pytest.raises(ValueError):
        tool_call_parser("pythonic")
    with pytest.raises(ValueError):
        write_tool_calls("pythonic", [])


@pytest.mark.parametrize("format", TOOL_CALL_FORMATS)
def test_no_calls_writes_nothing(format):
    assert write_tool_calls(format, []) == ""


@pytest.mark.parametrize("format", TOOL_CALL_FORMATS)
def test_writer_output_reads_back(format):
    calls = [("get_weather", {"city": NON_ASCII, "days": 3}), ("crm.find_user", {"filter": {"ids": [1, 2]}, "x": None})]
    types = {"get_weather": {"city": "string", "days": "integer"}}
    expected = [ToolCall(name, json.dumps(arguments, ensure_ascii=False)) for name, arguments in calls]
    text = write_tool_calls(format, calls)
    assert run(format, [text], types) == expected
    assert run(format, single_characters(text), types) == expected


@pytest.mark.parametrize("format", TOOL_CALL_FORMATS)
def test_plain_text_stays_linear(format):
    parser = tool_call_parser(format)
    # Characters that start markers in some format, so that every feed holds something back.
    chunk = "Some words < [ | \uff5c <tool <\uff5c [TOOL\n"
    started = time.perf_counter()
    for _ in range(50_000):
        parser.feed(chunk)
    parser.finish()
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("format", TOOL_CALL_FORMATS)
def test_long_call_stays_linear(format):
    text = write_tool_calls(format, [("f", {"text": "abcd " * 40_000})])
    parser = tool_call_parser(format, {"f": {"text": "string"}})
    started = time.perf_counter()
    pieces = [piece for i in range(0, len(text), 3) for piece in parser.feed(text[i : i + 3])] + parser.finish()
    assert time.perf_counter() - started < 5
    assert pieces == [call("f", text="abcd " * 40_000)]


@pytest.mark.parametrize("format", TOOL_CALL_FORMATS)
def test_long_run_of_whitespace_stays_linear(format):
    parser = tool_call_parser(format)
    parser.feed("x")
    started = time.perf_counter()
    for _ in range(100_000):
        parser.feed("\n ")
    parser.feed("y")
    assert time.perf_counter() - started < 5


# -- properties -----------------------------------------------------------------------

COMMON_FRAGMENTS = ["x", " ", "\n", "é", "🎉", '"', "\\", "{", "}", "<", ">", "[", "]"]
FRAGMENTS = {
    "hermes": [
        "<tool_call>",
        "</tool_call>",
        "<tool",
        "</tool_c",
        '{"name": "f", "arguments": {"a": 1}}',
        '{"name": "g", "arguments": {}}',
    ],
    "llama3_json": [
        "<|python_tag|>",
        "<|py",
        '{"name": "f", "parameters": {"a": 1}}',
        '{"name": "g", "arguments": {}}',
        ";",
    ],
    "mistral": ["[TOOL_CALLS]", "[TOOL", "[ARGS]", "[AR", "f", '{"a": 1}', '[{"name": "f", "arguments": {}}]'],
    "qwen3_coder": [
        "<tool_call>",
        "</tool_call>",
        "<function=f>",
        "<function=",
        "</function>",
        "<parameter=a>",
        "</parameter>",
        "<para",
        "1",
        "[1]",
    ],
    "deepseek_v3": [
        DEEPSEEK_CALLS_BEGIN,
        DEEPSEEK_CALLS_END,
        DEEPSEEK_CALL_BEGIN,
        DEEPSEEK_CALL_END,
        DEEPSEEK_SEP,
        "<\uff5ctool\u2581",
        "function",
        "f",
        "\n```json\n",
        "\n```",
        '{"a": 1}',
        "\uff5c",
    ],
}


@settings(max_examples=150, deadline=None)
@pytest.mark.parametrize("format", TOOL_CALL_FORMATS)
@given(data=st.data())
def test_any_split_reads_as_the_whole_text(format, data):
    text = "".join(data.draw(st.lists(st.sampled_from(FRAGMENTS[format] + COMMON_FRAGMENTS), max_size=25)))
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=15))
    assert run(format, split(text, cuts)) == run(format, [text])


@settings(max_examples=50, deadline=None)
@pytest.mark.parametrize("format", TOOL_CALL_FORMATS)
@given(data=st.data())
def test_one_character_at_a_time_reads_as_the_whole_text(format, data):
    text = "".join(data.draw(st.lists(st.sampled_from(FRAGMENTS[format] + COMMON_FRAGMENTS), max_size=25)))
    assert run(format, single_characters(text)) == run(format, [text])


MARKUP = {
    "hermes": ["<tool_call>", "</tool_call>"],
    "llama3_json": ["<|python_tag|>"],
    "mistral": ["[TOOL_CALLS]", "[ARGS]"],
    "qwen3_coder": ["<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>"],
    "deepseek_v3": [DEEPSEEK_CALLS_BEGIN, DEEPSEEK_CALLS_END, DEEPSEEK_CALL_BEGIN, DEEPSEEK_CALL_END, DEEPSEEK_SEP],
}

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,15}(\.[A-Za-z_][A-Za-z0-9_]{0,10})?", fullmatch=True)
identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**15), 10**15)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)


def _containers(inner):
    return st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3))


values = st.recursive(scalars, _containers, max_leaves=8)
# Text around calls that cannot start markup in any format.
prose = st.text(st.characters(blacklist_characters="<[{", blacklist_categories=("Cs",)), max_size=30)


def parameter_types(calls):
    """The schema types of the calls' arguments, per function (several calls may share one)."""
    types = {}
    for name, arguments in calls:
        for key, value in arguments.items():
            assume(types.setdefault(name, {}).setdefault(key, schema_type(value)) == schema_type(value))
    return types


def schema_type(value):
    for python_type, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array")):
        if isinstance(value, python_type):
            return name
    return "null" if value is None else "object"


@settings(max_examples=100, deadline=None)
@pytest.mark.parametrize("format", TOOL_CALL_FORMATS)
@given(data=st.data())
def test_written_calls_read_back(format, data):
    keys = identifiers if format == "qwen3_coder" else st.text(max_size=10)
    calls = data.draw(st.lists(st.tuples(names, st.dictionaries(keys, values, max_size=4)), min_size=1, max_size=3))
    serialized = json.dumps(calls, ensure_ascii=False)
    assume(not any(marker in serialized for marker in MARKUP[format]))
    if format == "llama3_json":
        # The whole output must be calls; only whitespace may come before and after.
        before = data.draw(st.sampled_from(["", " ", "\n\n"]))
        after = data.draw(st.sampled_from(["", "\n"]))
    else:
        before, after = data.draw(prose), data.draw(prose)
    types = parameter_types(calls)
    text = before + write_tool_calls(format, calls) + after
    expected = [Text(before.rstrip())] if before.strip() and format != "llama3_json" else []
    expected += [ToolCall(name, json.dumps(arguments, ensure_ascii=False)) for name, arguments in calls]
    if after.strip() and format != "llama3_json":
        expected.append(Text(after.lstrip()))
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=15))
    assert run(format, split(text, cuts), types) == expected


def reads_as_non_string(text):
    try:
        return not isinstance(json.loads(text.strip()), str)
    except ValueError:
        return False


@settings(max_examples=100, deadline=None)
@given(
    arguments=st.dictionaries(
        identifiers,
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.lists(st.integers(), max_size=3)
        | st.text(max_size=20).filter(lambda s: not reads_as_non_string(s)),
        max_size=5,
    )
)
def test_qwen3_coder_without_types_reads_json_values_and_keeps_other_text(arguments):
    assume(not any(marker in json.dumps(arguments, ensure_ascii=False) for marker in MARKUP["qwen3_coder"]))
    pieces = run("qwen3_coder", [write_tool_calls("qwen3_coder", [("f", arguments)])])
    assert len(pieces) == 1 and json.loads(pieces[0].arguments) == arguments
