"""Splits a gpt-oss completion token stream into Harmony messages.

A pure, incremental layer over openai-harmony's StreamableParser: tokens in, a flat
list of message fragments out (message started / text delta / message ended). It knows
nothing of the Responses API; ``response_builder`` turns fragments into events."""

from __future__ import annotations

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
    """Feeds completion tokens (the prompt ended with ``<|start|>assistant``)."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._parser = StreamableParser(encoding, role=Role.ASSISTANT)
        self._message_token, self._stop_tokens = _boundary_tokens(encoding)
        self._in_content = False
        self._broken = False
        self.channel: str | None = None
        # Tokens of analysis-channel messages (<|message|>, the text, the closing token), reported
        # as usage.output_tokens_details.reasoning_tokens.
        self.reasoning_tokens = 0

    @property
    def in_message(self) -> bool:
        return self._in_content

    def feed(self, token_ids: list[int]) -> list[Fragment]:
        fragments: list[Fragment] = []
        if self._broken:
            return fragments
        parser = self._parser
        for index, token in enumerate(token_ids):
            try:
                parser.process(token)
            except HarmonyError as exc:
                self._broken = True
                fragments.append(MalformedOutput(str(exc)))
                return fragments
            # The parser's own state is a JSON dump of the whole message so far, which
            # costs a pass over it for every token; the state follows from the token:
            # ``<|message|>`` opens the content, a stop token closes it (a token out of
            # place has raised above).
            in_content = token not in self._stop_tokens if self._in_content else token == self._message_token
            if in_content and not self._in_content:
                self.channel = parser.current_channel
                fragments.append(
                    MessageStarted(self.channel, parser.current_recipient, parser.current_content_type)
                )
            if in_content:
                if self.channel == "analysis":
                    self.reasoning_tokens += 1
                delta = parser.last_content_delta
                if delta:
                    fragments.append(TextDelta(delta, index))
            elif self._in_content:
                if self.channel == "analysis":
                    self.reasoning_tokens += 1
                fragments.append(MessageEnded())
                self.channel = None
            self._in_content = in_content
        return fragments


@lru_cache(maxsize=4)
def _boundary_tokens(encoding: HarmonyEncoding) -> tuple[int, frozenset[int]]:
    """``<|message|>``, and the tokens that end a message (``<|end|>``, ``<|return|>``, ``<|call|>``)."""
    (message,) = encoding.encode("<|message|>", allowed_special="all")
    return message, frozenset(encoding.stop_tokens())
