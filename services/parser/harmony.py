"""Splits a gpt-oss completion token stream into Harmony messages.

A pure, incremental layer: tokens in, a flat list of message fragments out (message
started / text delta / message ended), exactly as openai-harmony's StreamableParser
reads the stream (its parser reads every header). It knows nothing of the Responses
API; ``response_builder`` turns fragments into events."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

from openai_harmony import HarmonyEncoding, HarmonyError, Role, StreamableParser


@dataclass(frozen=True, slots=True)
class MessageStarted:
    channel: str | None
    recipient: str | None
    content_type: str | None


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    # Index of the token that produced this text within the tokens fed in one call.
    token_index: int


@dataclass(frozen=True, slots=True)
class MessageEnded:
    pass


@dataclass(frozen=True, slots=True)
class MalformedOutput:
    """The model broke the Harmony grammar; the tokens after this one are not parsed."""

    detail: str


Fragment = MessageStarted | TextDelta | MessageEnded | MalformedOutput


class HarmonyStreamSplitter:
    """Feeds completion tokens (the prompt ended with ``<|start|>assistant``).

    The message framing is followed here, token by token: ``<|start|>``, a header up to
    ``<|message|>``, content up to a stop token. Each header is read by openai-harmony's
    own parser, and what it made of a header is remembered, since the same few headers
    recur. Running Harmony's parser on every token cost about a third of the parser
    service's CPU: it renders a formatting token (a pass over ~1,100 special tokens) for
    each header token and for each new parser (``steno bench``)."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._grammar = _grammar_of(encoding)
        self._state = _HEADER
        self._first_message = True  # its role (assistant) ended the prompt
        self._header: list[int] = []
        self._undecoded = b""
        self._broken = False
        self.channel: str | None = None
        # Tokens of analysis-channel messages (<|message|>, the text, the closing token), reported
        # as usage.output_tokens_details.reasoning_tokens.
        self.reasoning_tokens = 0

    @property
    def in_message(self) -> bool:
        return self._state is _CONTENT

    def feed(self, token_ids: list[int]) -> list[Fragment]:
        fragments: list[Fragment] = []
        if self._broken:
            return fragments
        grammar = self._grammar
        for index, token in enumerate(token_ids):
            if self._state is _CONTENT:
                if self.channel == "analysis":
                    self.reasoning_tokens += 1
                if token in grammar.stop_tokens:
                    fragments.append(MessageEnded())
                    self.channel = None
                    self._state = _EXPECT_START
                    self._undecoded = b""
                    continue
                delta = self._decode(grammar.bytes_of(token))
                if delta:
                    fragments.append(TextDelta(delta, index))
            elif self._state is _EXPECT_START:
                if token != grammar.start_token:
                    return self._break(
                        fragments, f"Unexpected token {token} while expecting start token {grammar.start_token}"
                    )
                self._state = _HEADER
            elif token != grammar.message_token:
                self._header.append(token)
            else:
                header = grammar.header(self._first_message, tuple(self._header))
                if isinstance(header, str):
                    return self._break(fragments, header)
                self._first_message = False
                self._header = []
                self._state = _CONTENT
                self.channel = header.channel
                fragments.append(header)
                if self.channel == "analysis":
                    self.reasoning_tokens += 1
        return fragments

    def _decode(self, data: bytes) -> str | None:
        """The text a content token completes, as Harmony's parser reports it: a token
        may end partway through a character: the text before it goes, its bytes wait
        for the next token's. A sequence that can never become text goes as U+FFFD with
        the text before it, and the bytes after it wait."""
        pending = self._undecoded + data
        try:
            text = pending.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.end == len(pending) and exc.reason == "unexpected end of data":
                text, self._undecoded = pending[:exc.start].decode("utf-8"), pending[exc.start:]
                return text or None
            # Up to and including the first bad sequence; what follows waits.
            text, self._undecoded = pending[:exc.end].decode("utf-8", "replace"), pending[exc.end:]
            return text
        self._undecoded = b""
        return text

    def _break(self, fragments: list[Fragment], detail: str) -> list[Fragment]:
        self._broken = True
        fragments.append(MalformedOutput(detail))
        return fragments


_EXPECT_START, _HEADER, _CONTENT = "expect start", "header", "content"
_HEADERS_REMEMBERED = 4096


class _Grammar:
    """One encoding's framing tokens, token bytes, and the headers read so far."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._encoding = encoding
        (self.start_token,) = encoding.encode("<|start|>", allowed_special="all")
        (self.message_token,) = encoding.encode("<|message|>", allowed_special="all")
        self.stop_tokens = frozenset(encoding.stop_tokens())
        self._bytes: dict[int, bytes] = {}
        self._headers: OrderedDict[tuple[bool, tuple[int, ...]], MessageStarted | str] = OrderedDict()

    def bytes_of(self, token: int) -> bytes:
        data = self._bytes.get(token)
        if data is None:
            data = self._encoding.decode([token], errors="surrogateescape").encode("utf-8", "surrogateescape")
            self._bytes[token] = data
        return data

    def header(self, first_message: bool, tokens: tuple[int, ...]) -> MessageStarted | str:
        """What Harmony reads in a header (the tokens between ``<|start|>`` and
        ``<|message|>``; the first message's role came with the prompt), or why it
        rejects it."""
        key = (first_message, tokens)
        known = self._headers.get(key)
        if known is not None:
            self._headers.move_to_end(key)
            return known
        if first_message:
            parser, framed = StreamableParser(self._encoding, role=Role.ASSISTANT), [*tokens, self.message_token]
        else:
            parser, framed = StreamableParser(self._encoding, role=None), [self.start_token, *tokens, self.message_token]
        try:
            for token in framed:
                parser.process(token)
            known = MessageStarted(parser.current_channel, parser.current_recipient, parser.current_content_type)
        except HarmonyError as exc:
            known = str(exc)
        self._headers[key] = known
        if len(self._headers) > _HEADERS_REMEMBERED:
            self._headers.popitem(last=False)
        return known


@lru_cache(maxsize=4)
def _grammar_of(encoding: HarmonyEncoding) -> _Grammar:
    return _Grammar(encoding)
