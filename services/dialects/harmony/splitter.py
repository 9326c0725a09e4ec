"""Splits a gpt-oss completion token stream into Harmony messages.

A pure, incremental layer: tokens in, a flat list of message fragments out (message
started / text delta / message ended), as openai-harmony's StreamableParser reads the
stream (its parser reads every header): the same text from the same tokens, with a run
of tokens that are whole characters each read as one delta rather than one per token.
It knows nothing of the Responses API; the parser service turns fragments into events."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from openai_harmony import HarmonyEncoding, HarmonyError, Role, StreamableParser

from steno.schemas.responses import ParseContext
from steno.services.dialects.base import Fragment, MalformedOutput, MessageEnded, MessageStarted, TextDelta


class HarmonyStreamSplitter:
    """Feeds completion tokens (the prompt ended with ``<|start|>assistant``).

    The message framing is followed here, token by token: ``<|start|>``, a header up to
    ``<|message|>``, content up to a stop token. Each header is read by openai-harmony's
    own parser, and what it made of a header is remembered, since the same few headers
    recur: Harmony's parser renders a formatting token (a pass over all its special
    tokens) for each header token and for each new parser, which on every token was a
    large part of the parser service's CPU (docs/performance.md)."""

    def __init__(self, grammar: HarmonyGrammar, context: ParseContext) -> None:
        self._grammar = grammar
        self._context = context
        self._state = _HEADER
        self._first_message = True  # its role (assistant) ended the prompt
        self._header: list[int] = []
        self._undecoded = b""
        self._broken = False
        self.channel: str | None = None
        # Tokens of analysis-channel messages (<|message|>, the text, the closing token), reported
        # as usage.output_tokens_details.reasoning_tokens.
        self.reasoning_tokens = 0

    def finish(self) -> list[Fragment]:
        """Harmony holds nothing back: a message cut short is closed by the builder."""
        return []

    def feed(self, token_ids: Sequence[int]) -> list[Fragment]:
        fragments: list[Fragment] = []
        if self._broken:
            return fragments
        grammar = self._grammar
        index, fed = 0, len(token_ids)
        while index < fed:
            token = token_ids[index]
            if self._state is _CONTENT:
                text = "" if self._undecoded else grammar.text_of(token)
                if text:
                    # Tokens of whole characters read as one delta, however many follow: a
                    # delta per token was most of the splitter's work (docs/performance.md).
                    texts, end = [text], index + 1
                    while end < fed and (text := grammar.text_of(token_ids[end])):
                        texts.append(text)
                        end += 1
                    fragments.append(TextDelta("".join(texts), index, end - index))
                    if self.channel == "analysis":
                        self.reasoning_tokens += end - index
                    index = end
                    continue
                if self.channel == "analysis":
                    self.reasoning_tokens += 1
                if token in grammar.stop_tokens:
                    fragments.append(MessageEnded())
                    self.channel = None
                    self._state = _EXPECT_START
                    self._undecoded = b""
                else:
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
                # Harmony's parser reads a header only at its <|message|>, which an engine
                # that emitted a token outside the vocabulary may never send.
                if not grammar.knows(token):
                    return self._break(fragments, f"Unknown token {token} in a message header")
                self._header.append(token)
            else:
                header = grammar.header(self._first_message, tuple(self._header))
                if isinstance(header, str):
                    return self._break(fragments, header)
                self._first_message = False
                self._header = []
                self._state = _CONTENT
                self.channel = header.channel
                fragments.append(MessageStarted(header.channel, normalized_recipient(header.recipient, self._context),
                                                header.content_type))
                if self.channel == "analysis":
                    self.reasoning_tokens += 1
            index += 1
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


def normalized_recipient(recipient: str | None, context: ParseContext) -> str | None:
    """openai-harmony reads a content-type constraint in a header without a recipient
    (``<|channel|>final <|constrain|>json<|message|>``) as the recipient
    ``<|constrain|>json`` (or ``json``): that is a message, not a call."""
    if not recipient or recipient.startswith("<|"):
        return None
    if recipient in _CONTENT_TYPES and recipient not in context.function_tools:
        return None
    return recipient


_CONTENT_TYPES = frozenset({"json", "code", "text"})


class HarmonyGrammar:
    """One encoding's framing tokens, token bytes, and the headers read so far (shared
    by every response's splitter)."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._encoding = encoding
        (self.start_token,) = encoding.encode("<|start|>", allowed_special="all")
        (self.message_token,) = encoding.encode("<|message|>", allowed_special="all")
        self.stop_tokens = frozenset(encoding.stop_tokens())
        self._bytes: dict[int, bytes] = {}
        self._texts: dict[int, str] = {}
        self._headers: OrderedDict[tuple[bool, tuple[int, ...]], MessageStarted | str] = OrderedDict()

    def bytes_of(self, token: int) -> bytes:
        data = self._bytes.get(token)
        if data is None:
            data = self._encoding.decode([token], errors="surrogateescape").encode("utf-8", "surrogateescape")
            self._bytes[token] = data
        return data

    def knows(self, token: int) -> bool:
        """Whether ``token`` is one of the encoding's."""
        try:
            self.bytes_of(token)
        except (HarmonyError, OverflowError):
            return False
        return True

    def text_of(self, token: int) -> str:
        """The text a content token reads as by itself: empty for a stop token, a token
        of no bytes, or one whose bytes are not whole characters (it needs its
        neighbours' to become text)."""
        text = self._texts.get(token)
        if text is None:
            try:
                text = "" if token in self.stop_tokens else self.bytes_of(token).decode("utf-8")
            except UnicodeDecodeError:
                text = ""
            self._texts[token] = text
        return text

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
            parser = StreamableParser(self._encoding, role=None)
            framed = [self.start_token, *tokens, self.message_token]
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

