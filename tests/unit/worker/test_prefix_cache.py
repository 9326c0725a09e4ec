from steno.services.worker.prefix_cache import BLOCK_TOKENS, PrefixCache


def prompt(*blocks: int, tail: int = 0) -> list[int]:
    """Whole blocks, each of one repeated token, then ``tail`` loose tokens."""
    return [token for block in blocks for token in [block] * BLOCK_TOKENS] + [999] * tail


def test_a_new_prompt_finds_nothing_and_the_same_prompt_again_finds_its_whole_blocks():
    cache = PrefixCache()
    assert cache.admit(prompt(1, 2, 3, tail=5)) == 0
    assert cache.admit(prompt(1, 2, 3, tail=5)) == 3 * BLOCK_TOKENS


def test_only_a_shared_prefix_counts_not_a_block_met_elsewhere():
    cache = PrefixCache()
    cache.admit(prompt(1, 2, 3))
    assert cache.admit(prompt(1, 2, 9)) == 2 * BLOCK_TOKENS
    # Block 3 was seen, but after 1, 2: after 7 it is another block.
    assert cache.admit(prompt(7, 3)) == 0
    assert cache.admit(prompt(1, 2, 9, 4)) == 3 * BLOCK_TOKENS


def test_a_conversation_growing_turn_by_turn_finds_each_earlier_turn():
    cache = PrefixCache()
    history: list[int] = []
    found = []
    for turn in range(1, 5):
        history += prompt(turn, tail=3)
        found.append(cache.admit(history))
    # Each turn's prompt holds the last one's; only its whole blocks can be found again.
    assert found == [0] + [len(prompt(1, tail=3)) * (turn - 1) // BLOCK_TOKENS * BLOCK_TOKENS for turn in range(2, 5)]


def test_the_cache_forgets_the_least_recently_used_blocks_beyond_its_capacity():
    cache = PrefixCache(capacity=4)
    cache.admit(prompt(1, 2))
    cache.admit(prompt(3, 4))
    cache.admit(prompt(1, 2))  # used again: now the most recent
    cache.admit(prompt(5, 6))
    assert len(cache) == 4
    assert cache.admit(prompt(1, 2)) == 2 * BLOCK_TOKENS
    assert cache.admit(prompt(3, 4)) == 0
