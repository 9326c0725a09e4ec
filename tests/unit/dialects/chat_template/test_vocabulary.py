# ruff: noqa: RUF001 (DeepSeek's markers are written with full-width bars)
import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steno.services.dialects.chat_template.vocabulary import (
    IncrementalDecoder,
    byte_level_tokenizer,
    byte_symbols,
    trained_tokenizer,
)

SPECIALS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<｜tool▁call▁begin｜>", "[TOOL_CALLS]"]
TEXT = "Déjà vu, 日本 🎉"
CORPUS = [
    "Déjà vu, 日本 🎉 the quick brown fox jumps over the lazy dog.",
    "日本語のテキストと English text, naïve café, ünïcödé 🎉🎊🚀",
    "def main():\n    return {\"city\": \"Paris\", \"temp\": 21}\n",
] * 30


@functools.cache
def byte_level():
    return byte_level_tokenizer(SPECIALS)


@functools.cache
def trained():
    # Small enough that some merges end inside a character, large enough for whole words.
    return trained_tokenizer(CORPUS, 360, SPECIALS)


def decode(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=False)


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False).ids


def test_byte_level_ids_special_tokens_first_then_bytes():
    tokenizer = byte_level()
    assert tokenizer.get_vocab_size() == len(SPECIALS) + 256
    for index, token in enumerate(SPECIALS):
        assert tokenizer.token_to_id(token) == index
        assert decode(tokenizer, [index]) == token
    for byte in range(256):
        assert tokenizer.id_to_token(len(SPECIALS) + byte) == byte_symbols()[byte]
    assert encode(tokenizer, "A") == [len(SPECIALS) + ord("A")]


def test_byte_level_special_tokens_split_out_of_text():
    tokenizer = byte_level()
    ids = encode(tokenizer, "a<think>b</think><|im_end|>[TOOL_CALLS]")
    n = len(SPECIALS)
    assert ids == [n + ord("a"), 2, n + ord("b"), 3, 1, 5]
    assert decode(tokenizer, ids) == "a<think>b</think><|im_end|>[TOOL_CALLS]"
    # A special token's text inside a longer word still is the special token.
    assert encode(tokenizer, "x<think>y")[1] == 2


def test_byte_level_is_stable_and_checks_its_tokens():
    assert byte_level_tokenizer(SPECIALS).to_str() == byte_level().to_str()
    repeated = byte_level_tokenizer(["<a>", "<b>", "<a>"])
    assert [repeated.token_to_id(t) for t in ("<a>", "<b>")] == [0, 1] and repeated.get_vocab_size() == 258
    with pytest.raises(ValueError):
        byte_level_tokenizer(["<a>", ""])
    with pytest.raises(ValueError):
        byte_level_tokenizer(["!"])  # a byte symbol


@pytest.mark.parametrize("make", [byte_level, trained])
def test_round_trip_of_non_ascii_text(make):
    tokenizer = make()
    text = f"<|im_start|>{TEXT}<think>{TEXT}</think>{TEXT}<|im_end|>"
    assert decode(tokenizer, encode(tokenizer, text)) == text


def test_byte_level_is_one_token_a_byte():
    assert len(encode(byte_level(), TEXT)) == len(TEXT.encode())


def test_trained_tokenizer_merges_and_splits_characters():
    tokenizer = trained()
    assert [tokenizer.token_to_id(t) for t in SPECIALS] == list(range(len(SPECIALS)))
    ids = encode(tokenizer, CORPUS[0] + CORPUS[1])
    pieces = [decode(tokenizer, [i]) for i in ids]
    assert any(len(piece) > 2 and "\ufffd" not in piece for piece in pieces)  # multi-character tokens
    assert any("\ufffd" in piece for piece in pieces)  # a character split across tokens
    assert len(ids) < len((CORPUS[0] + CORPUS[1]).encode())


def test_trained_tokenizer_is_deterministic():
    assert trained_tokenizer(CORPUS, 360, SPECIALS).to_str() == trained().to_str()
    with pytest.raises(ValueError):
        trained_tokenizer(CORPUS, 100, SPECIALS)


def decode_in_pieces(tokenizer, ids, cuts):
    decoder = IncrementalDecoder(tokenizer)
    pieces, start = [], 0
    for cut in [*sorted(set(cuts)), len(ids)]:
        pieces.append(decoder.feed(ids[start:cut]))
        start = cut
    pieces.append(decoder.finish())
    return pieces


PARTS = st.sampled_from(["Déjà", " vu", ",", " 日本", "語", " 🎉", "🚀", " the", " fox", "\n", "ü", "\ufffd",
                         *SPECIALS])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(PARTS, max_size=14), which=st.sampled_from(["byte_level", "trained"]), data=st.data())
def test_incremental_decode_equals_whole_decode_under_any_split(parts, which, data):
    tokenizer = byte_level() if which == "byte_level" else trained()
    ids = encode(tokenizer, "".join(parts))
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)))
    pieces = decode_in_pieces(tokenizer, ids, cuts)
    assert "".join(pieces) == decode(tokenizer, ids) == "".join(parts)
    # Nothing is given before its character is whole.
    if "\ufffd" not in parts:
        assert all("\ufffd" not in piece for piece in pieces)


@settings(max_examples=300, deadline=None)
@given(which=st.sampled_from(["byte_level", "trained"]), data=st.data())
def test_incremental_decode_of_arbitrary_ids(which, data):
    """Ids no encoder would give (stray continuation bytes, truncated characters) still
    come out as the whole decode gives them."""
    tokenizer = byte_level() if which == "byte_level" else trained()
    ids = data.draw(st.lists(st.integers(0, tokenizer.get_vocab_size() - 1), max_size=16))
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)))
    assert "".join(decode_in_pieces(tokenizer, ids, cuts)) == decode(tokenizer, ids)


def test_an_incomplete_character_is_held_until_complete_or_finished():
    tokenizer = byte_level()
    first, second, third = encode(tokenizer, "日")
    decoder = IncrementalDecoder(tokenizer)
    assert decoder.feed([first, second]) == ""
    assert decoder.feed([third]) == "日"
    assert decoder.feed([first, second]) == ""
    assert decoder.feed([tokenizer.token_to_id("<think>")]) == "\ufffd<think>"
    assert decoder.feed([first]) == ""
    assert decoder.finish() == "\ufffd"
    # finish starts afresh.
    assert decoder.feed(encode(tokenizer, "ok")) == "ok"
    assert decoder.finish() == ""
    assert decoder.feed([]) == ""


class CountingTokenizer:
    """Counts the ids each decode is given."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.decoded = 0

    def decode(self, ids, skip_special_tokens=True):
        self.decoded += len(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("make", [byte_level, trained])
def test_each_token_costs_a_small_window(make):
    tokenizer = make()
    ids = encode(tokenizer, (CORPUS[1] + "<think>" + CORPUS[0]) * 20)
    counting = CountingTokenizer(tokenizer)
    decoder = IncrementalDecoder(counting)
    text = "".join(decoder.feed([token]) for token in ids) + decoder.finish()
    assert text == decode(tokenizer, ids)
    # A window holds the previous emission's tokens and the new ones: a few ids a token,
    # however long the stream.
    assert counting.decoded < 8 * len(ids)
