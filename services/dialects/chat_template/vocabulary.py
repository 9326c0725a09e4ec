"""Hugging Face tokenizers for chat-template models, built without any download, and a
detokenizer that turns a stream of token ids into text as the ids arrive.

``byte_level_tokenizer`` is the simulator's vocabulary: every byte is a token and every
marker of a family (role headers, ``<think>``, ``<tool_call>``, ...) one special token,
so that any text encodes and the markers are single tokens, as in the real models.
``trained_tokenizer`` learns merges from a corpus, for tests that need tokens of several
characters and characters split across tokens."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from steno.services.dialects.reused_tokens import ReusedTokens

BYTE_COUNT = 256
REPLACEMENT_CHARACTER = "\ufffd"


@functools.cache
def byte_symbols() -> tuple[str, ...]:
    """The printable character standing for each byte in a byte-level BPE (GPT-2's
    table, the alphabet of ``tokenizers``' ``ByteLevel``), indexed by byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols: dict[int, str] = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(BYTE_COUNT):
        if byte not in symbols:
            symbols[byte] = chr(BYTE_COUNT + shifted)
            shifted += 1
    return tuple(symbols[byte] for byte in range(BYTE_COUNT))


def _unique_special_tokens(special_tokens: Sequence[str]) -> list[str]:
    unique: list[str] = []
    for token in special_tokens:
        if not token:
            raise ValueError("a special token cannot be empty")
        if token not in unique:
            unique.append(token)
    return unique


def _special(token: str) -> AddedToken:
    # Not normalized and not stripped: a marker matches only its exact text.
    return AddedToken(token, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False)


def _byte_level(tokenizer: Tokenizer) -> Tokenizer:
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def byte_level_tokenizer(special_tokens: Sequence[str]) -> Tokenizer:
    """A byte-level BPE without merges: the special tokens take ids ``0 .. n-1`` in the
    given order (a repeated one keeps its first place), then byte ``b`` is id ``n + b``.

    Text holding a special token's literal text encodes to that token's id, as
    Hugging Face tokenizers treat special tokens; everything else is one token a byte."""
    specials = _unique_special_tokens(special_tokens)
    symbols = byte_symbols()
    clashes = sorted(set(specials) & set(symbols))
    if clashes:
        raise ValueError(f"special tokens {clashes} are byte symbols of the vocabulary")
    vocab = {token: index for index, token in enumerate(specials)}
    vocab.update({symbol: len(specials) + byte for byte, symbol in enumerate(symbols)})
    # The special tokens are in the model's vocabulary too, so that adding them keeps
    # their ids instead of appending new ones after the bytes.
    tokenizer = _byte_level(Tokenizer(models.BPE(vocab=vocab, merges=[])))
    tokenizer.add_special_tokens([_special(token) for token in specials])
    return tokenizer


def trained_tokenizer(corpus: Iterable[str], vocab_size: int, special_tokens: Sequence[str]) -> Tokenizer:
    """A byte-level BPE trained on ``corpus`` up to ``vocab_size`` tokens (fewer if the
    corpus runs out of pairs): the special tokens first, in the given order, then the 256
    byte symbols, then the merges. The same corpus gives the same tokenizer."""
    specials = _unique_special_tokens(special_tokens)
    if vocab_size < len(specials) + BYTE_COUNT:
        raise ValueError(f"vocab_size {vocab_size} cannot hold {len(specials)} special tokens and {BYTE_COUNT} bytes")
    tokenizer = _byte_level(Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[_special(token) for token in specials],
        initial_alphabet=list(byte_symbols()),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return tokenizer


class PromptEncoder:
    """``tokenizer.encode(text, add_special_tokens=False).ids``, piece by piece: the text
    between added tokens (the system prompt, the tools, each earlier turn) is encoded by
    itself, as the tokenizer does within the whole, and a piece encoded before is reused
    (``ReusedTokens``, per ``scope``), so that a conversation's next turn costs the
    encoding of what it adds rather than of all of it.

    A piece encodes the same alone only where nothing in the tokenizer depends on where
    the piece stands: not with a Metaspace pre-tokenizer (it may mark only the first
    piece of a text), nor with truncation or padding set, nor where special tokens are
    read as plain text (``encode_special_tokens``), nor at an added token that strips
    its neighbours; such text is encoded whole."""

    def __init__(self, tokenizer: Tokenizer, reused: ReusedTokens | None = None) -> None:
        self._tokenizer = tokenizer
        self._reused = reused or ReusedTokens()
        pre_tokenizer = tokenizer.pre_tokenizer
        piecewise = (pre_tokenizer is not None and b"Metaspace" not in pre_tokenizer.__getstate__()
                     and tokenizer.truncation is None and tokenizer.padding is None
                     and not tokenizer.encode_special_tokens)
        # Added tokens are found in the raw text, longest first where several start at
        # one place, as the tokenizer finds them; those matched after normalizing are
        # found by each piece's own encoding. None: one that strips its neighbours.
        self._added: dict[str, int | None] = {
            token.content: None if token.lstrip or token.rstrip or token.single_word else token_id
            for token_id, token in tokenizer.get_added_tokens_decoder().items() if not token.normalized
        }
        self._splitter = re.compile("|".join(re.escape(content) for content in
                                             sorted(self._added, key=len, reverse=True))) \
            if piecewise and self._added else None

    def encode(self, text: str, scope: str = "") -> list[int]:
        if self._splitter is None:
            return self._whole(text)
        ids: list[int] = []
        start = 0
        for match in self._splitter.finditer(text):
            token = self._added[match.group()]
            if token is None:
                return self._whole(text)
            ids += self._piece(text[start:match.start()], scope)
            ids.append(token)
            start = match.end()
        ids += self._piece(text[start:], scope)
        return ids

    def _piece(self, piece: str, scope: str) -> Sequence[int]:
        if not piece:
            return ()
        return self._reused.tokens((scope, piece, None), lambda: self._whole(piece))

    def _whole(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids


class TokenTexts:
    """The text a token reads as wherever it stands, for a splitter to read a run of such
    tokens at once instead of decoding each in its window.

    Only a byte-level decoder (Qwen's, Llama 3's, DeepSeek's) gives a token the same
    bytes in any context; SentencePiece's decoders drop a leading space at the start of
    a decode, so with them no token has such a text. Nor do added tokens (markers, stop
    tokens) and the ``excluded`` ones, and a token whose bytes are not whole characters
    (its neighbours finish them)."""

    def __init__(self, tokenizer: Tokenizer, excluded: Iterable[int] = ()) -> None:
        self._tokenizer = tokenizer
        self.context_free = isinstance(tokenizer.decoder, decoders.ByteLevel)
        self._excluded = frozenset(tokenizer.get_added_tokens_decoder()) | frozenset(excluded)
        self._vocabulary_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._texts: dict[int, str | None] = {}

    def _learn(self, token: int) -> str | None:
        if not self.context_free or token in self._excluded or not 0 <= token < self._vocabulary_size:
            return None
        text: str | None = self._tokenizer.decode([token], skip_special_tokens=False)
        if not text or REPLACEMENT_CHARACTER in text:
            text = None
        self._texts[token] = text
        return text

    def run(self, token_ids: Sequence[int], start: int, stops: str) -> list[str]:
        """The texts of the tokens from ``start`` on, up to the first that has none or
        holds any of the characters in ``stops``."""
        texts: list[str] = []
        known = self._texts
        for at in range(start, len(token_ids)):
            token = token_ids[at]
            text = known[token] if token in known else self._learn(token)
            if text is None:
                break
            for stop in stops:
                if stop in text:
                    return texts
            texts.append(text)
        return texts


class IncrementalDecoder:
    """Token ids in, text out, as they arrive: what ``tokenizer.decode(ids,
    skip_special_tokens=False)`` gives for all the ids fed so far, in pieces.

    Special tokens decode to their text. A token that ends inside a character (byte-level
    pieces split UTF-8) is held until the character is complete; ``finish`` gives what is
    still held, an incomplete character as U+FFFD. The concatenation of every ``feed`` and
    ``finish`` is the whole decode, however the ids were split.

    As vLLM's ``detokenize_incrementally``, each step decodes only a window: from the
    ``prefix`` offset (the start of the previous emission, left as context because some
    decoders, SentencePiece's, change a token's text at the start of a decode) to the
    end, and emits what it adds to the text of ``prefix .. read``. A window whose text
    ends in U+FFFD is held, since the next token may complete its last character; text
    that truly ends in U+FFFD is held only until the next token or ``finish``.

    With ``texts``, ``read_run`` reads a run of tokens whose texts are known at once.
    """

    def __init__(self, tokenizer: Tokenizer, texts: TokenTexts | None = None) -> None:
        self._tokenizer = tokenizer
        # None where no token has a text of its own: no run to look for, token after token.
        self._texts = texts if texts is not None and texts.context_free else None
        # Ids from the prefix offset on; those before it are never decoded again.
        self._ids: list[int] = []
        # The emitted text runs to ``_read``; both offsets index ``_ids``.
        self._prefix = 0
        self._read = 0

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def _advance(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        if not final and (len(text) <= len(prefix_text) or text.endswith(REPLACEMENT_CHARACTER)):
            return ""
        # The window now ends on a whole character: the next one starts at this read offset.
        del self._ids[:self._read]
        self._prefix, self._read = 0, len(self._ids)
        return text[len(prefix_text):]

    def feed(self, token_ids: Sequence[int]) -> str:
        """The new text these tokens complete (empty while a character is unfinished)."""
        if not token_ids:
            return ""
        self._ids.extend(token_ids)
        return self._advance(final=False)

    def read_run(self, token_ids: Sequence[int], start: int, stops: str) -> tuple[str, int]:
        """The text of the run of tokens from ``start`` whose texts are known (``TokenTexts``)
        and hold none of ``stops``, and the index after the run, where the decoder then
        stands as if it had been fed them one by one. An empty run while a character is
        unfinished."""
        if self._texts is None or self._read != len(self._ids):
            return "", start
        texts = self._texts.run(token_ids, start, stops)
        if not texts:
            return "", start
        end = start + len(texts)
        # The run's last token is the next window's prefix, as after a feed of it alone.
        self._ids[:] = [token_ids[end - 1]]
        self._prefix, self._read = 0, 1
        return "".join(texts), end

    def finish(self) -> str:
        """Whatever is still held; the decoder then starts afresh."""
        text = self._advance(final=True)
        self._ids.clear()
        self._prefix = self._read = 0
        return text
