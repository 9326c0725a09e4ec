"""Token ids of texts a dialect rendered before, for the next request that renders the
same text (the same system prompt and tools, a conversation's earlier turns), so that a
turn costs the rendering of what it adds.

Kept per ``scope`` (the tenant; "" for text that holds none of a tenant's own), so that
one tenant's text never serves, nor shows in the timing of, another's request; texts
over a size are never kept, and the whole stays within a byte budget, the least
recently used going first."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence

MAX_TEXT_CHARS = 64 * 1024
MAX_BYTES = 8 * 1024 * 1024

# (scope, text, what else the tokens depend on)
Key = tuple[str, str, Hashable]


class ReusedTokens:
    def __init__(self, max_bytes: int = MAX_BYTES, max_text_chars: int = MAX_TEXT_CHARS) -> None:
        self.max_bytes = max_bytes
        self._max_text_chars = max_text_chars
        self._kept: OrderedDict[Key, array[int]] = OrderedDict()
        self.kept_bytes = 0

    def tokens(self, key: Key, render: Callable[[], Iterable[int]]) -> Sequence[int]:
        """The tokens kept for ``key``, or ``render``'s (kept unless the text is large)."""
        tokens = self._kept.get(key)
        if tokens is not None:
            self._kept.move_to_end(key)
            return tokens
        if len(key[1]) > self._max_text_chars:
            return list(render())
        tokens = array("I", render())
        self._kept[key] = tokens
        self.kept_bytes += _size(key, tokens)
        while self.kept_bytes > self.max_bytes:
            self.kept_bytes -= _size(*self._kept.popitem(last=False))
        return tokens

    def kept(self) -> list[Key]:
        return list(self._kept)


def _size(key: Key, tokens: array[int]) -> int:
    return len(key[0]) + len(key[1]) + tokens.itemsize * len(tokens)
