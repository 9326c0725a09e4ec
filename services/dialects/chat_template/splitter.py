"""Splits a chat-template model's completion into message fragments (pure, incremental).

Tokens are decoded to text as they come (a character split across tokens waits for its
last byte); the reasoning parser takes the ``<think>`` block apart from the rest, and
the tool-call parser takes calls out of the rest. What is left is the answer. Markup
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
        for index, token in enumerate(token_ids):
            if self._ended:
                break
            if token in self._stop_token_ids:
                self._end(fragments, index, self._decoder.finish())
                continue
            was_reasoning = self._open == ANALYSIS
            self._text(fragments, index, self._decoder.feed([token]))
            if was_reasoning or self._open == ANALYSIS:
                self.reasoning_tokens += 1
        return fragments

    def finish(self) -> list[Fragment]:
        fragments: list[Fragment] = []
        if not self._ended:
            self._end(fragments, 0, self._decoder.finish())
        return fragments

    def _end(self, fragments: list[Fragment], index: int, text: str) -> None:
        self._text(fragments, index, text)
        if self._reasoning is not None:
            self._pieces(fragments, index, self._reasoning.finish())
        if self._calls is not None:
            self._calls_out(fragments, index, self._calls.finish())
        self._close(fragments)
        self._ended = True

    def _text(self, fragments: list[Fragment], index: int, text: str) -> None:
        if not text:
            return
        if self._reasoning is None:
            self._content(fragments, index, text)
        else:
            self._pieces(fragments, index, self._reasoning.feed(text))

    def _pieces(self, fragments: list[Fragment], index: int, pieces: list[Reasoning | Content]) -> None:
        for piece in pieces:
            if isinstance(piece, Reasoning):
                self._say(fragments, index, ANALYSIS, piece.text)
            else:
                self._content(fragments, index, piece.text)

    def _content(self, fragments: list[Fragment], index: int, text: str) -> None:
        if self._calls is None:
            self._say(fragments, index, FINAL, text)
        else:
            self._calls_out(fragments, index, self._calls.feed(text))

    def _calls_out(self, fragments: list[Fragment], index: int, pieces: Sequence[Text | ToolCall | Malformed]) -> None:
        for piece in pieces:
            if isinstance(piece, Text):
                self._say(fragments, index, FINAL, piece.text)
            elif isinstance(piece, ToolCall):
                self._close(fragments)
                name = resolve_tool_name(piece.name, self._offered)
                fragments += [MessageStarted("commentary", f"functions.{name}", "json"),
                              TextDelta(piece.arguments, index), MessageEnded()]
            else:
                self._close(fragments)
                fragments.append(MalformedOutput(piece.detail))
                self._ended = True

    def _say(self, fragments: list[Fragment], index: int, channel: str, text: str) -> None:
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
        fragments.append(TextDelta(text, index))

    def _close(self, fragments: list[Fragment]) -> None:
        if self._open is not None:
            fragments.append(MessageEnded())
            self._open = None
