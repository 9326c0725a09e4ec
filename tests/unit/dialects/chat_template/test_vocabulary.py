# ruff: noqa: RUF001 (DeepSeek's markers are written with full-width bars)
import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from steno.services.dialects.chat_template.vocabulary import (
    IncrementalDecoder,
    PromptEncoder,
    TokenTexts,
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


@settings(max_examples=200, deadline=None)
@given(which=st.sampled_from(["byte_level", "trained"]), data=st.data())
def test_known_token_texts_join_to_the_decode_of_any_sequence_of_them(which, data):
    tokenizer = byte_level() if which == "byte_level" else trained()
    texts = TokenTexts(tokenizer)
    ids = data.draw(st.lists(st.integers(0, tokenizer.get_vocab_size() - 1), max_size=24))
    known = [token for token in ids if texts.run([token], 0, "")]
    assert "".join(texts.run(known, 0, "")) == decode(tokenizer, known)


def test_markers_unfinished_characters_and_excluded_tokens_have_no_text():
    tokenizer = trained()
    first_byte_of_a_character = tokenizer.token_to_id(byte_symbols()["日".encode()[0]])
    texts = TokenTexts(tokenizer, excluded=[encode(tokenizer, " the")[0]])
    for token in [*(tokenizer.token_to_id(marker) for marker in SPECIALS), encode(tokenizer, " the")[0],
                  first_byte_of_a_character, tokenizer.get_vocab_size(), -1]:
        assert texts.run([token], 0, "") == []
    # A run ends before the first token holding a stop character.
    assert "".join(texts.run(encode(tokenizer, " fox <fox"), 0, "<")) == " fox "


def test_a_decoder_that_reads_tokens_in_context_gives_no_texts():
    """SentencePiece's decoder drops the space that starts a decode: a token's text
    depends on where it stands."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    ids = encode(tokenizer, "the quick brown fox")
    assert decode(tokenizer, ids[1:2]) != decode(tokenizer, ids[:2])[len(decode(tokenizer, ids[:1])):]
    assert TokenTexts(tokenizer).run(ids, 0, "") == []


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(PARTS, max_size=14), which=st.sampled_from(["byte_level", "trained"]), data=st.data())
def test_runs_read_between_single_feeds_decode_the_whole(parts, which, data):
    tokenizer = byte_level() if which == "byte_level" else trained()
    ids = encode(tokenizer, "".join(parts))
    decoder = IncrementalDecoder(tokenizer, TokenTexts(tokenizer))
    pieces, index = [], 0
    while index < len(ids):
        text, end = decoder.read_run(ids, index, data.draw(st.sampled_from(["", "<", " "])))
        if end == index:
            text, end = decoder.feed(ids[index:index + 1]), index + 1
        pieces.append(text)
        index = end
    assert "".join(pieces) + decoder.finish() == decode(tokenizer, ids)


def metaspace_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    tokenizer.decoder = decoders.Metaspace(prepend_scheme="first")
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                             special_tokens=SPECIALS))
    return tokenizer


def extended_tokenizer() -> Tokenizer:
    """The trained vocabulary with two more added tokens: one that eats the spaces around
    it, one that begins as another does."""
    tokenizer = Tokenizer.from_str(trained().to_str())
    tokenizer.add_special_tokens([AddedToken("<eat>", lstrip=True, rstrip=True, normalized=False),
                                  AddedToken("<|im_start|>system", normalized=False)])
    return tokenizer


def specials_as_text_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer.from_str(trained().to_str())
    tokenizer.encode_special_tokens = True
    return tokenizer


TOKENIZERS = {"byte_level": byte_level, "trained": trained, "metaspace": metaspace_tokenizer,
              "extended": extended_tokenizer, "specials as text": specials_as_text_tokenizer}
PROMPT_PARTS = st.sampled_from([*PARTS.elements, " <eat> ", "<eat>", "  ", "<|im", "_start|>", "system",
                                "<|im_start|>system"])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(PROMPT_PARTS, max_size=20), which=st.sampled_from(sorted(TOKENIZERS)),
       scopes=st.lists(st.sampled_from(["", "a", "b"]), min_size=2, max_size=2))
def test_a_prompt_encoded_piece_by_piece_is_the_tokenizer_s_own_encoding(parts, which, scopes):
    tokenizer = TOKENIZERS[which]()
    encoder = PromptEncoder(tokenizer)
    text = "".join(parts)
    for scope in scopes:  # the second time, pieces may be reused
        assert encoder.encode(text, scope) == encode(tokenizer, text)


class CountingEncoder:
    """A tokenizer that counts the characters it is given to encode."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.encoded = 0

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def encode(self, text, add_special_tokens=True):
        self.encoded += len(text)
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens)


def test_a_conversation_s_next_turn_encodes_only_what_it_adds_and_only_within_its_scope():
    counting = CountingEncoder(trained())
    encoder = PromptEncoder(counting)
    turns = [f"<|im_start|>user\n{CORPUS[i % 3]} {i}<|im_end|>\n" for i in range(12)]
    conversation = "".join(turns)
    encoder.encode(conversation, "a")
    counting.encoded = 0
    longer = conversation + "<|im_start|>user\nDéjà vu?<|im_end|>\n"
    assert encoder.encode(longer, "a") == encode(trained(), longer)
    assert counting.encoded == len("user\nDéjà vu?")  # the line break after it was met before
    counting.encoded = 0
    encoder.encode(conversation, "b")  # another tenant's request reuses nothing of a's
    pieces = set(conversation.replace("<|im_start|>", "|").replace("<|im_end|>", "|").split("|")) - {""}
    assert counting.encoded == sum(len(piece) for piece in pieces)
