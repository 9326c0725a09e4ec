"""Reads (and writes) the tool calls of chat-template models out of their output text.

Each family marks its calls in its own way (see ``tool_call_parser``); the parsers here
take the text as it streams, in pieces of any size, and give back the text around the
calls and each call once it is complete. What they read does not depend on how the text
was split: a marker cut in two, a multi-byte character alone in a piece, one character
per feed. Markup is never given back as text: whatever may be the start of a marker is
held until the following text decides it.

Whitespace next to a call (before it, between calls, after it) is dropped, so that the
text around calls reads as the model meant it ("Let me check." rather than "Let me
check.\\n\\n"); text with no call after it keeps its trailing whitespace.

vLLM's parsers are the reference for what each format means (tests/vllm checks that both
read the same calls). Where vLLM drops output, these parsers keep it or report it: text
after the calls is text, and a call that cannot be read is a Malformed piece rather than
plain content, so that the caller can fail the response visibly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from steno.services.dialects.chat_template.reasoning import partial_marker_length


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    # A JSON object as text: json.dumps(parsed_arguments, ensure_ascii=False).
    arguments: str


@dataclass(frozen=True, slots=True)
class Malformed:
    detail: str


Piece = Text | ToolCall | Malformed


class ToolCallParser(Protocol):
    def feed(self, text: str) -> list[Piece]: ...

    def straight_through(self) -> str | None:
        """The characters markup may begin with, when text holding none of them comes
        out as text, as it would piece by piece; None while a call or a decision is
        pending."""

    def finish(self) -> list[Piece]: ...


TOOL_CALL_FORMATS = ("hermes", "llama3_json", "mistral", "qwen3_coder", "deepseek_v3")

HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_TOOL_CALLS, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
QWEN_FUNCTION_START, QWEN_FUNCTION_END = "<function=", "</function>"
# DeepSeek's markers are spelled with FULLWIDTH VERTICAL LINE (U+FF5C) and LOWER ONE
# EIGHTH BLOCK (U+2581), not ``|`` and ``_``.
DEEPSEEK_CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
DEEPSEEK_CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
DEEPSEEK_CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
DEEPSEEK_CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
DEEPSEEK_SEP = "<\uff5ctool\u2581sep\uff5c>"

# How much of the offending text a Malformed detail quotes.
_QUOTE = 200


def _quote(text: str) -> str:
    return repr(text if len(text) <= _QUOTE else text[:_QUOTE] + "…")


def _arguments_text(arguments: Any) -> str:
    return json.dumps(arguments, ensure_ascii=False)


def _reject_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity, which no JSON client can read back.
    raise ValueError(f"{name} is not JSON")


_JSON = json.JSONDecoder(parse_constant=_reject_constant)


def _loads(text: str) -> Any:
    """``json.loads`` without NaN/Infinity; raises ValueError."""
    return _JSON.decode(text)


class _Output:
    """Collects the pieces of one feed; drops the whitespace that touches a call."""

    def __init__(self) -> None:
        self._pieces: list[Piece] = []
        # Trailing whitespace of the text so far: given out only when more text follows,
        # dropped when a call does. A list, so that a long run of whitespace stays linear.
        self._pending_space: list[str] = []
        self._after_call = False

    def text(self, text: str) -> None:
        if not text:
            return
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        trimmed = text.rstrip()
        if not trimmed:
            self._pending_space.append(text)
            return
        self._append_text("".join(self._pending_space) + trimmed)
        self._pending_space = [text[len(trimmed) :]] if len(trimmed) < len(text) else []

    def call(self, piece: ToolCall | Malformed) -> None:
        self._pending_space = []
        self._after_call = True
        self._pieces.append(piece)

    def finish(self) -> None:
        if self._pending_space:
            self._append_text("".join(self._pending_space))
            self._pending_space = []

    def take(self) -> list[Piece]:
        pieces, self._pieces = self._pieces, []
        return pieces

    def _append_text(self, text: str) -> None:
        last = self._pieces[-1] if self._pieces else None
        if isinstance(last, Text):
            self._pieces.pop()
            text = last.text + text
        self._pieces.append(Text(text))


def _earliest(text: str, markers: Sequence[str]) -> tuple[int, str | None]:
    best, found = -1, None
    for marker in markers:
        index = text.find(marker)
        if index >= 0 and (best < 0 or index < best):
            best, found = index, marker
    return best, found


def _partial_length(text: str, markers: Sequence[str]) -> int:
    return max((partial_marker_length(text, marker) for marker in markers), default=0)


class _StreamingParser:
    """Holds what was fed until ``_advance`` decides it, and gives out what it decided."""

    def __init__(self) -> None:
        self._output = _Output()
        self._held = ""

    def feed(self, text: str) -> list[Piece]:
        if text:
            self._held += text
            self._advance()
        return self._output.take()

    def _advance(self) -> None:
        raise NotImplementedError


class _DelimitedCallParser(_StreamingParser):
    """Formats whose calls sit between a start and an end marker.

    ``markers`` maps each start marker to its end marker, or to None for a marker that
    only frames calls and is dropped (DeepSeek's ``tool▁calls▁begin/end``). The body
    between a start and its end marker goes to ``read_body``, which returns the calls
    it holds (or a Malformed piece).
    """

    def __init__(
        self, markers: Mapping[str, str | None], read_body: Callable[[str, str], list[ToolCall | Malformed]]
    ) -> None:
        self._markers = dict(markers)
        self._start_markers = tuple(markers)
        self._read_body = read_body
        super().__init__()
        self._open_marker: str | None = None
        self._end_marker: str | None = None
        self._body: list[str] = []
        self._marker_starts = "".join(sorted({marker[0] for marker in markers}))

    def straight_through(self) -> str | None:
        return None if self._end_marker is not None or self._held else self._marker_starts

    def finish(self) -> list[Piece]:
        held, self._held = self._held, ""
        if self._end_marker is None:
            self._output.text(held)
        else:
            body = "".join(self._body) + held
            self._output.call(Malformed(f"unterminated tool call: {_quote(str(self._open_marker) + body)}"))
            self._open_marker = self._end_marker = None
            self._body = []
        self._output.finish()
        return self._output.take()

    def _advance(self) -> None:
        while self._held:
            text = self._held
            if self._end_marker is None:
                index, marker = _earliest(text, self._start_markers)
                if marker is None:
                    keep = _partial_length(text, self._start_markers)
                    self._output.text(text[: len(text) - keep])
                    self._held = text[len(text) - keep :]
                    return
                self._output.text(text[:index])
                self._held = text[index + len(marker) :]
                end_marker = self._markers[marker]
                if end_marker is not None:
                    self._open_marker, self._end_marker, self._body = marker, end_marker, []
            else:
                index = text.find(self._end_marker)
                if index < 0:
                    keep = partial_marker_length(text, self._end_marker)
                    self._body.append(text[: len(text) - keep])
                    self._held = text[len(text) - keep :]
                    return
                self._body.append(text[:index])
                self._held = text[index + len(self._end_marker) :]
                assert self._open_marker is not None
                for piece in self._read_body(self._open_marker, "".join(self._body)):
                    self._output.call(piece)
                self._open_marker = self._end_marker = None
                self._body = []


# -- hermes ---------------------------------------------------------------------------


def _call_from_object(value: Any, *, argument_keys: Sequence[str]) -> ToolCall | str:
    """A ``{"name": ..., "arguments": {...}}`` object as a call, or why it is not one."""
    if not isinstance(value, dict):
        return "not a JSON object"
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return 'no "name" string'
    for key in argument_keys:
        if key in value:
            arguments = value[key]
            break
    else:
        return f"no {' or '.join(repr(k) for k in argument_keys)} object"
    if isinstance(arguments, str):
        # Some models encode the arguments object once more, as a JSON string.
        try:
            arguments = _loads(arguments)
        except ValueError:
            return "the arguments are a string that is not a JSON object"
    if not isinstance(arguments, dict):
        return "the arguments are not a JSON object"
    return ToolCall(name.strip(), _arguments_text(arguments))


def _read_hermes_body(marker: str, body: str) -> list[ToolCall | Malformed]:
    try:
        value = _loads(body)
    except ValueError as error:
        return [Malformed(f"tool call is not valid JSON ({error}): {_quote(body)}")]
    call = _call_from_object(value, argument_keys=("arguments", "parameters"))
    if isinstance(call, str):
        return [Malformed(f"tool call: {call}: {_quote(body)}")]
    return [call]


# -- qwen3_coder ----------------------------------------------------------------------

_QWEN_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|(?=<function=)|\Z)", re.DOTALL)
_QWEN_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


def _trim_one_newline(value: str) -> str:
    # The template writes each value on its own line between the tags.
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def convert_parameter(value: str, schema_type: str | None) -> Any:
    """A Qwen3-Coder parameter's text as the JSON value its schema type says it is.

    Text that does not read as the declared type is kept as text: the caller's schema
    validation reports it better than a parse failure would.
    """
    if schema_type == "string":
        return value
    stripped = value.strip()
    if schema_type in ("integer", "number"):
        try:
            number = _loads(stripped)
        except ValueError:
            return value
        if isinstance(number, bool) or not isinstance(number, int | float):
            return value
        if schema_type == "integer" and isinstance(number, float) and number.is_integer():
            return int(number)
        return number
    if schema_type == "boolean":
        # 1 and 0 too, as vLLM reads them.
        return {"true": True, "false": False, "1": True, "0": False}.get(stripped.lower(), value)
    if schema_type == "null":
        return None if stripped == "null" else value
    if schema_type in ("object", "array"):
        try:
            parsed = _loads(stripped)
        except ValueError:
            return value
        return parsed if isinstance(parsed, dict if schema_type == "object" else list) else value
    try:
        parsed = _loads(stripped)
    except ValueError:
        return value
    return value if isinstance(parsed, str) else parsed


class _Qwen3CoderBodyReader:
    def __init__(self, parameter_types: Mapping[str, Mapping[str, str]] | None) -> None:
        self._types = parameter_types or {}

    def __call__(self, marker: str, body: str) -> list[ToolCall | Malformed]:
        if marker == QWEN_FUNCTION_START:
            body = QWEN_FUNCTION_START + body + QWEN_FUNCTION_END
        calls: list[ToolCall | Malformed] = []
        for function in _QWEN_FUNCTION.finditer(body):
            name = function.group(1).strip()
            if not name:
                calls.append(Malformed(f"tool call without a function name: {_quote(function.group(0))}"))
                continue
            types = self._types.get(name, {})
            arguments = {
                parameter.group(1).strip(): convert_parameter(
                    _trim_one_newline(parameter.group(2)), types.get(parameter.group(1).strip())
                )
                for parameter in _QWEN_PARAMETER.finditer(function.group(2))
            }
            calls.append(ToolCall(name, _arguments_text(arguments)))
        if not calls:
            return [Malformed(f"tool call without <function=...>: {_quote(marker + body)}")]
        return calls


# -- deepseek_v3 ----------------------------------------------------------------------

_DEEPSEEK_V3_CALL = re.compile(r"(?P<name>[^\n]*)\n```(?:json)?[ \t]*\n(?P<arguments>.*?)\n?```\s*\Z", re.DOTALL)


def _read_deepseek_body(marker: str, body: str) -> list[ToolCall | Malformed]:
    head, separator, rest = body.partition(DEEPSEEK_SEP)
    if not separator:
        return [Malformed(f"tool call without {DEEPSEEK_SEP}: {_quote(body)}")]
    if rest.lstrip().startswith("{"):
        # V3.1: NAME<sep>{ARGS}
        name, arguments_text = head.strip(), rest
    else:
        # V3 / R1: TYPE<sep>NAME\n```json\n{ARGS}\n```
        match = _DEEPSEEK_V3_CALL.match(rest)
        if match is None:
            detail = "tool call is neither NAME<sep>{...} nor TYPE<sep>NAME and a ```json block"
            return [Malformed(f"{detail}: {_quote(body)}")]
        name, arguments_text = match.group("name").strip(), match.group("arguments")
    if not name:
        return [Malformed(f"tool call without a function name: {_quote(body)}")]
    try:
        arguments = _loads(arguments_text)
    except ValueError as error:
        return [Malformed(f"tool call arguments are not valid JSON ({error}): {_quote(arguments_text)}")]
    if not isinstance(arguments, dict):
        return [Malformed(f"tool call arguments are not a JSON object: {_quote(arguments_text)}")]
    return [ToolCall(name, _arguments_text(arguments))]


# -- llama3_json ----------------------------------------------------------------------


class _Llama3JsonParser:
    """Llama 3.x JSON calls: the whole output is ``{"name": ..., "parameters": {...}}``,
    several separated by ``;``, optionally after ``<|python_tag|>``.

    There is no end marker and a call is only known to be one when the output ends (a
    plain JSON answer looks the same at first), so output that starts like a call is
    held until ``finish``. Output that starts otherwise is text, given out as it comes.
    """

    def __init__(self) -> None:
        # Leading whitespace, then what may still be the start of <|python_tag|>.
        self._leading_space: list[str] = []
        self._held = ""
        self._decided: bool | None = None  # True: may be calls; False: text
        self._chunks: list[str] = []

    def feed(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self._decided is False:
            return [Text(text)]
        if self._decided is True:
            self._chunks.append(text)
            return []
        if not self._held:
            start = text.lstrip()
            self._leading_space.append(text[: len(text) - len(start)])
            text = start
        self._held += text
        if not self._held or (len(self._held) < len(PYTHON_TAG) and PYTHON_TAG.startswith(self._held)):
            return []
        held = "".join(self._leading_space) + self._held
        self._held, self._leading_space = "", []
        if held.lstrip().startswith((PYTHON_TAG, "{")):
            self._decided = True
            self._chunks.append(held)
            return []
        self._decided = False
        return [Text(held)]

    def straight_through(self) -> str | None:
        return "" if self._decided is False else None

    def finish(self) -> list[Piece]:
        if self._decided is not True:
            held = "".join(self._leading_space) + self._held
            self._held, self._leading_space = "", []
            return [Text(held)] if held else []
        text = "".join(self._chunks)
        self._chunks = []
        calls = _read_llama3_calls(text)
        if isinstance(calls, list):
            return list(calls)
        if text.lstrip().startswith(PYTHON_TAG):
            return [Malformed(f"{PYTHON_TAG} output is not JSON tool calls ({calls}): {_quote(text)}")]
        return [Text(text)]


def _read_llama3_calls(text: str) -> list[ToolCall] | str:
    calls: list[ToolCall] = []
    position = 0
    while True:
        while True:
            stripped = text[position:].lstrip(" \t\r\n;")
            position = len(text) - len(stripped)
            if stripped.startswith(PYTHON_TAG):
                position += len(PYTHON_TAG)
            else:
                break
        if position >= len(text):
            break
        if text[position] != "{":
            return f"unexpected text at {position}"
        try:
            value, position = _JSON.raw_decode(text, position)
        except ValueError as error:
            return f"invalid JSON: {error}"
        call = _call_from_object(value, argument_keys=("parameters", "arguments"))
        if isinstance(call, str):
            return call
        calls.append(call)
    return calls if calls else "no call"


# -- mistral --------------------------------------------------------------------------


class _JsonEnd:
    """Finds where a JSON object or array that streams in ends, one piece at a time."""

    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def scan(self, text: str) -> int:
        """Index just past the end of the value in ``text``, or -1 if it goes on."""
        for index, char in enumerate(text):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return index + 1
        return -1


class _MistralParser(_StreamingParser):
    """Mistral: ``[TOOL_CALLS]`` then either ``name[ARGS]{...}`` (tokenizers v11 and
    later, one marker per call) or a JSON array of ``{"name", "arguments"}`` objects
    (older ones). A call ends where its JSON ends (the format has no end marker), so it
    is given out as soon as its last bracket arrives; text after it is text again.
    """

    _TEXT, _AFTER_MARKER, _NAME, _BEFORE_ARGUMENTS, _JSON = range(5)

    def __init__(self) -> None:
        super().__init__()
        self._state = self._TEXT
        self._name = ""
        self._json: list[str] = []
        self._json_end = _JsonEnd()
        # Whether the JSON being read is a call's arguments (after its name) or the
        # older form's array/object of whole calls.
        self._json_is_arguments = False

    def straight_through(self) -> str | None:
        return MISTRAL_TOOL_CALLS[0] if self._state == self._TEXT and not self._held else None

    def finish(self) -> list[Piece]:
        held, self._held = self._held, ""
        if self._state == self._TEXT:
            self._output.text(held)
        else:
            unfinished = self._name + "".join(self._json) + held
            self._output.call(Malformed(f"unterminated tool call after {MISTRAL_TOOL_CALLS}: {_quote(unfinished)}"))
        self._state = self._TEXT
        self._output.finish()
        return self._output.take()

    def _advance(self) -> None:
        while self._held:
            text = self._held
            if self._state == self._TEXT:
                index = text.find(MISTRAL_TOOL_CALLS)
                if index < 0:
                    keep = partial_marker_length(text, MISTRAL_TOOL_CALLS)
                    self._output.text(text[: len(text) - keep])
                    self._held = text[len(text) - keep :]
                    return
                self._output.text(text[:index])
                self._held = text[index + len(MISTRAL_TOOL_CALLS) :]
                self._state = self._AFTER_MARKER
                self._name = ""
                self._json = []
            elif self._state == self._AFTER_MARKER:
                start = text.lstrip()
                self._held = start
                if not start:
                    return
                if start.startswith(MISTRAL_TOOL_CALLS):
                    # A repeated marker with nothing between counts once.
                    self._held = start[len(MISTRAL_TOOL_CALLS) :]
                elif MISTRAL_TOOL_CALLS.startswith(start):
                    return
                elif start[0] in "[{":
                    self._start_json(arguments=False)
                else:
                    self._state = self._NAME
            elif self._state == self._NAME:
                args = text.find(MISTRAL_ARGS)
                brace = text.find("{")
                if args >= 0 and (brace < 0 or args < brace):
                    self._name += text[:args]
                    self._held = text[args + len(MISTRAL_ARGS) :]
                    self._state = self._BEFORE_ARGUMENTS
                elif brace >= 0:
                    # name{...}: the form without [ARGS] that vLLM also reads.
                    self._name += text[:brace]
                    self._held = text[brace:]
                    self._start_json(arguments=True)
                else:
                    keep = partial_marker_length(text, MISTRAL_ARGS)
                    self._name += text[: len(text) - keep]
                    self._held = text[len(text) - keep :]
                    return
            elif self._state == self._BEFORE_ARGUMENTS:
                start = text.lstrip()
                self._held = start
                if not start:
                    return
                if start[0] != "{":
                    self._output.call(
                        Malformed(f"{MISTRAL_TOOL_CALLS}{self._name}{MISTRAL_ARGS} is not followed by a JSON object")
                    )
                    self._state = self._TEXT
                    continue
                self._start_json(arguments=True)
            else:
                end = self._json_end.scan(text)
                if end < 0:
                    self._json.append(text)
                    self._held = ""
                    return
                self._json.append(text[:end])
                self._held = text[end:]
                self._finish_json("".join(self._json))

    def _start_json(self, *, arguments: bool) -> None:
        self._json_is_arguments = arguments
        self._json = []
        self._json_end = _JsonEnd()
        self._state = self._JSON

    def _finish_json(self, text: str) -> None:
        self._state = self._TEXT
        try:
            value = _loads(text)
        except ValueError as error:
            self._output.call(Malformed(f"tool call is not valid JSON ({error}): {_quote(text)}"))
            return
        if self._json_is_arguments:
            name = self._name.strip()
            if not name:
                self._output.call(Malformed(f"tool call without a name: {_quote(text)}"))
            elif not isinstance(value, dict):
                self._output.call(Malformed(f"arguments of {name!r} are not a JSON object: {_quote(text)}"))
            else:
                self._output.call(ToolCall(name, _arguments_text(value)))
            return
        entries = value if isinstance(value, list) else [value]
        if not entries:
            self._output.call(Malformed(f"empty list of tool calls after {MISTRAL_TOOL_CALLS}"))
        for entry in entries:
            call = _call_from_object(entry, argument_keys=("arguments",))
            self._output.call(call if isinstance(call, ToolCall) else Malformed(f"tool call: {call}: {_quote(text)}"))


# -- the public entry points ----------------------------------------------------------


def tool_call_parser(format: str, parameter_types: Mapping[str, Mapping[str, str]] | None = None) -> ToolCallParser:
    """A fresh streaming parser for one output in ``format`` (one of TOOL_CALL_FORMATS).

    ``parameter_types``: per function name, the JSON-schema type of each parameter;
    only qwen3_coder needs it (its values are untyped text).
    """
    if format == "hermes":
        return _DelimitedCallParser({HERMES_START: HERMES_END}, _read_hermes_body)
    if format == "qwen3_coder":
        return _DelimitedCallParser(
            {HERMES_START: HERMES_END, QWEN_FUNCTION_START: QWEN_FUNCTION_END}, _Qwen3CoderBodyReader(parameter_types)
        )
    if format == "deepseek_v3":
        return _DelimitedCallParser(
            {DEEPSEEK_CALLS_BEGIN: None, DEEPSEEK_CALLS_END: None, DEEPSEEK_CALL_BEGIN: DEEPSEEK_CALL_END},
            _read_deepseek_body,
        )
    if format == "llama3_json":
        return _Llama3JsonParser()
    if format == "mistral":
        return _MistralParser()
    raise ValueError(f"unknown tool-call format {format!r}; known: {', '.join(TOOL_CALL_FORMATS)}")


def _qwen3_coder_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def write_tool_calls(format: str, calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """The text a model of the ``format`` family writes for ``calls`` (name, arguments)."""
    if format == "hermes":
        return "\n".join(
            f"{HERMES_START}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{HERMES_END}"
            for name, arguments in calls
        )
    if format == "llama3_json":
        return "; ".join(
            json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False) for name, arguments in calls
        )
    if format == "mistral":
        return "".join(
            f"{MISTRAL_TOOL_CALLS}{name}{MISTRAL_ARGS}{_arguments_text(arguments)}" for name, arguments in calls
        )
    if format == "qwen3_coder":
        blocks = []
        for name, arguments in calls:
            parameters = "".join(
                f"<parameter={key}>\n{_qwen3_coder_value(value)}\n</parameter>\n" for key, value in arguments.items()
            )
            blocks.append(f"{HERMES_START}\n{QWEN_FUNCTION_START}{name}>\n{parameters}{QWEN_FUNCTION_END}\n{HERMES_END}")
        return "\n".join(blocks)
    if format == "deepseek_v3":
        if not calls:
            return ""
        body = "\n".join(
            f"{DEEPSEEK_CALL_BEGIN}function{DEEPSEEK_SEP}{name}\n```json\n{_arguments_text(arguments)}\n```"
            f"{DEEPSEEK_CALL_END}"
            for name, arguments in calls
        )
        return f"{DEEPSEEK_CALLS_BEGIN}{body}{DEEPSEEK_CALLS_END}"
    raise ValueError(f"unknown tool-call format {format!r}; known: {', '.join(TOOL_CALL_FORMATS)}")
