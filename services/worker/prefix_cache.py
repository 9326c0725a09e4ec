"""A model of an engine's prefix cache, for the simulator: which leading part of a
prompt an earlier prompt on this worker already computed.

Like vLLM's automatic prefix caching it works in whole blocks: a block is known by the
hash of its tokens chained onto its predecessor's, so a block hits only after the same
prefix. The cache holds at most ``capacity`` blocks and forgets the least recently used,
as an engine's memory would."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 16


class PrefixCache:
    def __init__(self, capacity: int = 65_536) -> None:
        self._capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def admit(self, prompt_token_ids: Sequence[int]) -> int:
        """The tokens of ``prompt_token_ids`` found cached (a whole number of blocks from
        the start); every whole block of it is cached afterwards."""
        cached = 0
        missed = False
        chain = 0
        for start in range(0, len(prompt_token_ids) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
            chain = hash((chain, tuple(prompt_token_ids[start: start + BLOCK_TOKENS])))
            if chain in self._blocks and not missed:
                cached += BLOCK_TOKENS
                self._blocks.move_to_end(chain)
            else:
                missed = True
                self._blocks[chain] = None
                self._blocks.move_to_end(chain)
        while len(self._blocks) > self._capacity:
            self._blocks.popitem(last=False)
        return cached
