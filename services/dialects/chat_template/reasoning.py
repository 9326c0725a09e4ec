"""Splits a chat-template model's output text into reasoning and content, as it streams.

The ``<think>`` families (DeepSeek-R1, Qwen3 and the many models trained like them) write
their reasoning between an open and a close tag, then the answer. Where the prompt
already ended with the open tag (DeepSeek-R1's template, Qwen3's thinking templates), the
output starts inside the reasoning and usually only the close tag appears.

Whitespace: the reasoning is stripped at both ends (the newline the templates put after
the open tag, the one models write before the close tag) and the content that follows
the close tag is stripped at its start; vLLM's ``deepseek_r1`` and ``qwen3`` parsers keep
that whitespace, so their texts equal ours after ``strip()`` / ``lstrip()``. Content
that never followed a close tag (no reasoning at all) is kept exactly as written.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class Content:
    text: str


class _State(Enum):
    # Not yet known whether the output opens with the open tag.
    UNDECIDED = auto()
    # Inside the reasoning, before its first character that is not whitespace.
    REASONING_START = auto()
    REASONING = auto()
    # After the close tag, before the first character that is not whitespace.
    CONTENT_START = auto()
    CONTENT = auto()


def partial_marker_length(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``marker``."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


class ThinkParser:
    """Streams reasoning and content out of text fed in arbitrary pieces.

    ``starts_inside``: the prompt ended with the open tag, so the output begins inside
    the reasoning (an open tag the model repeats at the very start is dropped).
    Otherwise reasoning happens only if the output opens (after whitespace) with the
    open tag; any other output is all content. After the close tag everything is
    content, tags included. Text that may be the beginning of a tag is held back until
    the next feed decides it; ``finish`` releases what is still held.
    """

    def __init__(self, open_tag: str = "<think>", close_tag: str = "</think>", *, starts_inside: bool = False) -> None:
        if not open_tag or not close_tag:
            raise ValueError("the open and close tags must not be empty")
        self._open = open_tag
        self._close = close_tag
        self._starts_inside = starts_inside
        self._state = _State.REASONING_START if starts_inside else _State.UNDECIDED
        self._held = ""
        # Undecided output's leading whitespace: content if no open tag follows it.
        self._leading_space: list[str] = []
        # Whitespace at the end of the reasoning so far: given out only once more
        # reasoning follows it, so that the reasoning never ends in whitespace. Lists, so
        # that a long run of whitespace stays linear.
        self._reasoning_trailing_space: list[str] = []
        self._open_tag_dropped = False
        self._pieces: list[Reasoning | Content] = []

    def feed(self, text: str) -> list[Reasoning | Content]:
        if text:
            self._held += text
            self._advance()
        return self._take_pieces()

    def straight_through(self) -> tuple[bool, str] | None:
        """Whether text fed now is reasoning, and the characters a tag begins with: text
        holding none of them comes out as it would piece by piece, all reasoning or all
        content. None while text is held or the parser is deciding where it is."""
        if self._held:
            return None
        if self._state is _State.REASONING:
            return True, self._close[0]
        if self._state is _State.CONTENT:
            return False, ""
        return None

    def finish(self) -> list[Reasoning | Content]:
        held, self._held = self._held, ""
        if self._state is _State.UNDECIDED:
            self._emit_content("".join(self._leading_space) + held)
        elif self._state in (_State.REASONING_START, _State.REASONING):
            self._emit_reasoning(held.lstrip() if self._state is _State.REASONING_START else held)
        elif self._state is _State.CONTENT:
            self._emit_content(held)
        self._reasoning_trailing_space = []
        self._leading_space = []
        self._state = _State.CONTENT
        return self._take_pieces()

    def _advance(self) -> None:
        while self._held:
            text = self._held
            if self._state is _State.UNDECIDED:
                start = text.lstrip()
                if len(start) < len(text):
                    self._leading_space.append(text[: len(text) - len(start)])
                self._held = start
                if not start or (len(start) < len(self._open) and self._open.startswith(start)):
                    return
                if start.startswith(self._open):
                    self._held = start[len(self._open) :]
                    self._leading_space = []
                    self._state = _State.REASONING_START
                else:
                    self._held = ""
                    self._state = _State.CONTENT
                    self._emit_content("".join(self._leading_space) + start)
                    self._leading_space = []
            elif self._state is _State.REASONING_START:
                start = text.lstrip()
                self._held = start
                if not start:
                    return
                if self._starts_inside and not self._open_tag_dropped:
                    if len(start) < len(self._open) and self._open.startswith(start):
                        return
                    if start.startswith(self._open):
                        self._open_tag_dropped = True
                        self._held = start[len(self._open) :]
                        continue
                self._state = _State.REASONING
            elif self._state is _State.REASONING:
                end = text.find(self._close)
                if end >= 0:
                    self._emit_reasoning(text[:end])
                    self._reasoning_trailing_space = []
                    self._held = text[end + len(self._close) :]
                    self._state = _State.CONTENT_START
                    continue
                keep = partial_marker_length(text, self._close)
                self._emit_reasoning(text[: len(text) - keep])
                self._held = text[len(text) - keep :]
                return
            elif self._state is _State.CONTENT_START:
                start = text.lstrip()
                self._held = ""
                if start:
                    self._state = _State.CONTENT
                    self._emit_content(start)
            else:
                self._held = ""
                self._emit_content(text)

    def _emit_reasoning(self, text: str) -> None:
        trimmed = text.rstrip()
        if not trimmed:
            if text:
                self._reasoning_trailing_space.append(text)
            return
        emitted = "".join(self._reasoning_trailing_space) + trimmed
        self._reasoning_trailing_space = [text[len(trimmed) :]] if len(trimmed) < len(text) else []
        if self._pieces and isinstance(self._pieces[-1], Reasoning):
            emitted = self._pieces.pop().text + emitted
        self._pieces.append(Reasoning(emitted))

    def _emit_content(self, text: str) -> None:
        if not text:
            return
        if self._pieces and isinstance(self._pieces[-1], Content):
            text = self._pieces.pop().text + text
        self._pieces.append(Content(text))

    def _take_pieces(self) -> list[Reasoning | Content]:
        pieces, self._pieces = self._pieces, []
        return pieces
