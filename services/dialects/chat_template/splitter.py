"""Splits a chat-template model's completion into message fragments (pure, incremental).

Tokens are decoded to text as they come (a character split across tokens waits for its
last byte), and where the parsers are letting text straight through to the open message,
a run of tokens whose texts are known is read as one delta naming them all. The
reasoning parser takes the ``<think>`` block apart from the rest, and the tool-call
parser takes calls out of the rest. What is left is the answer. Markup
that may yet turn out to be a call is held back until it is decided, so no part of it
reaches the answer's text; a stop token, or the end of the output, decides it. Calls
are named as they were offered: a name the model wrote bare, or with a namespace spelled
another way, resolves to the one offered tool it can mean.

Fragments: reasoning as an ``analysis`` message, the answer as a ``final`` one, each
call as a ``commentary`` message to ``functions.<qualified name>`` whose text is the
JSON arguments."""

from __future__ import annotations

from collections.abc import Sequence

from steno.schemas.responses import ParseContext
from steno.services.dialects.base import Fragment, MalformedOutput, MessageEnded, MessageStarted, TextDelta
from steno.services.dialects.chat_template.reasoning import Content, Reasoning, ThinkParser
from steno.services.dialects.chat_template.tool_calls import Malformed, Text, ToolCall, ToolCallParser, tool_call_parser
from steno.services.dialects.chat_template.vocabulary import IncrementalDecoder

ANALYSIS, FINAL = "analysis", "final"


def resolve_tool_name(written: str, offered: Sequence[str]) -> str:
    """The offered tool (qualified name) the model means by ``written``."""
    if written in offered:
        return written
    bare = written.removeprefix("functions.")
    if bare in offered:
        return bare
    for separator in ("__", "/", ":"):  # a namespace spelled otherwise
        if separator in bare and bare.replace(separator, ".", 1) in offered:
            return bare.replace(separator, ".", 1)
    matches = [name for name in offered if name.rsplit(".", 1)[-1] == bare]
    return matches[0] if len(matches) == 1 else bare


class ChatTemplateSplitter:
    def __init__(self, decoder: IncrementalDecoder, stop_token_ids: frozenset[int], context: ParseContext,
                 reasoning_tags: tuple[str, str] | None, tool_call_format: str) -> None:
        self._decoder = decoder
        self._stop_token_ids = stop_token_ids
        self._offered = list(context.function_tools)
        self._reasoning = ThinkParser(*reasoning_tags, starts_inside=context.reasoning_open) \
            if reasoning_tags is not None else None
        # No tools offered (tool_choice "none" among them): nothing the model writes is a call.
        self._calls: ToolCallParser | None = tool_call_parser(tool_call_format, context.parameter_types) \
            if self._offered else None
        self._open: str | None = None
        self._ended = False
        self.reasoning_tokens = 0

    def feed(self, token_ids: Sequence[int]) -> list[Fragment]:
        fragments: list[Fragment] = []
        index, fed = 0, len(token_ids)
        while index < fed and not self._ended:
            if (run := self._straight_run(token_ids, index)) is not None:
                text, end, channel = run
                self._text(fragments, range(index, end), text)
                if channel == ANALYSIS:
                    self.reasoning_tokens += end - index
                index = end
                continue
            token = token_ids[index]
            at = range(index, index + 1)
            if token in self._stop_token_ids:
                self._end(fragments, at, self._decoder.finish())
            else:
                was_reasoning = self._open == ANALYSIS
                self._text(fragments, at, self._decoder.feed([token]))
                if was_reasoning or self._open == ANALYSIS:
                    self.reasoning_tokens += 1
            index += 1
        return fragments

    def _straight_run(self, token_ids: Sequence[int], start: int) -> tuple[str, int, str] | None:
        """A run of tokens from ``start`` that the parsers let straight through to the
        message already open (its text, where it ends, the channel), read as one delta:
        decoding and parsing each token by itself was most of the splitter's work
        (docs/performance.md). None where some token may open, close or hold something."""
        stops = ""
        channel = FINAL
        if self._reasoning is not None:
            where = self._reasoning.straight_through()
            if where is None:
                return None
            reasoning, stops = where
            if reasoning:
                channel = ANALYSIS
        if channel == FINAL and self._calls is not None:
            markup = self._calls.straight_through()
            if markup is None:
                return None
            stops += markup
        if self._open != channel:
            return None
        text, end = self._decoder.read_run(token_ids, start, stops)
        return (text, end, channel) if end > start else None

    def finish(self) -> list[Fragment]:
        fragments: list[Fragment] = []
        if not self._ended:
            self._end(fragments, range(0, 1), self._decoder.finish())
        return fragments

    def _end(self, fragments: list[Fragment], tokens: range, text: str) -> None:
        self._text(fragments, tokens, text)
        if self._reasoning is not None:
            self._pieces(fragments, tokens, self._reasoning.finish())
        if self._calls is not None:
            self._calls_out(fragments, tokens, self._calls.finish())
        self._close(fragments)
        self._ended = True

    def _text(self, fragments: list[Fragment], tokens: range, text: str) -> None:
        if not text:
            return
        if self._reasoning is None:
            self._content(fragments, tokens, text)
        else:
            self._pieces(fragments, tokens, self._reasoning.feed(text))

    def _pieces(self, fragments: list[Fragment], tokens: range, pieces: list[Reasoning | Content]) -> None:
        for piece in pieces:
            if isinstance(piece, Reasoning):
                self._say(fragments, tokens, ANALYSIS, piece.text)
            else:
                self._content(fragments, tokens, piece.text)

    def _content(self, fragments: list[Fragment], tokens: range, text: str) -> None:
        if self._calls is None:
            self._say(fragments, tokens, FINAL, text)
        else:
            self._calls_out(fragments, tokens, self._calls.feed(text))

    def _calls_out(
        self, fragments: list[Fragment], tokens: range, pieces: Sequence[Text | ToolCall | Malformed]
    ) -> None:
        for piece in pieces:
            if isinstance(piece, Text):
                self._say(fragments, tokens, FINAL, piece.text)
            elif isinstance(piece, ToolCall):
                self._close(fragments)
                name = resolve_tool_name(piece.name, self._offered)
                fragments += [MessageStarted("commentary", f"functions.{name}", "json"),
                              TextDelta(piece.arguments, tokens.start, len(tokens)), MessageEnded()]
            else:
                self._close(fragments)
                fragments.append(MalformedOutput(piece.detail))
                self._ended = True

    def _say(self, fragments: list[Fragment], tokens: range, channel: str, text: str) -> None:
        if self._ended or not text:
            return
        if self._open != channel:
            self._close(fragments)
            # A message starts at its first visible character (templates and models put
            # line breaks between blocks).
            text = text.lstrip()
            if not text:
                return
            fragments.append(MessageStarted(channel, None, None))
            self._open = channel
        fragments.append(TextDelta(text, tokens.start, len(tokens)))

    def _close(self, fragments: list[Fragment]) -> None:
        if self._open is not None:
            fragments.append(MessageEnded())
            self._open = None
