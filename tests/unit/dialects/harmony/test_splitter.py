from hypothesis import given, settings
from hypothesis import strategies as st

from steno.schemas.responses import ParseContext
from steno.services.dialects import MalformedOutput, MessageEnded, MessageStarted, TextDelta
from steno.services.dialects.harmony.splitter import HarmonyGrammar, normalized_recipient
from tests.harmony_samples import assistant, completion, encoding, harmony


def split_all(tokens, cuts, context=ParseContext()):
    splitter = harmony().splitter(context)
    fragments, start = [], 0
    for cut in [*sorted(set(cuts)), len(tokens)]:
        fragments += splitter.feed(tokens[start:cut])
        start = cut
    return splitter, fragments


def messages_of(fragments):
    out = []
    for fragment in fragments:
        if isinstance(fragment, MessageStarted):
            out.append([fragment.channel, fragment.recipient, ""])
        elif isinstance(fragment, TextDelta):
            out[-1][2] += fragment.text
    return out


def deltas_joined(fragments):
    """Fragments with each run of consecutive deltas as one: its text, and every token
    that produced a part of it. The splitter reads a run of whole-character tokens as one
    delta where Harmony's parser reports one per token; the two agree in this form."""
    joined = []
    for fragment in fragments:
        if isinstance(fragment, TextDelta):
            tokens = list(range(fragment.token_index, fragment.token_index + fragment.token_count))
            if joined and isinstance(joined[-1], tuple):
                text, earlier = joined[-1]
                joined[-1] = (text + fragment.text, earlier + tokens)
            else:
                joined.append((fragment.text, tokens))
        else:
            joined.append(fragment)
    return joined


def test_reasoning_then_answer():
    tokens = completion([assistant("analysis", "Let me think."), assistant("final", "Hi there!")])
    splitter, fragments = split_all(tokens, [])
    assert messages_of(fragments) == [["analysis", None, "Let me think."], ["final", None, "Hi there!"]]
    assert sum(isinstance(f, MessageEnded) for f in fragments) == 2
    # <|message|>, the text, and the closing <|end|>
    assert splitter.reasoning_tokens == len(encoding().encode("Let me think.")) + 2


def test_a_run_of_whole_characters_is_one_delta_and_a_split_character_waits():
    """Tokens that are whole characters each come as one delta naming them all; a token
    that ends partway through a character produces no text of its own, and the token
    that completes it is the one its text is reported at."""
    enc = encoding()
    tokens = completion([assistant("final", "plain words, then a split one")])
    _, fragments = split_all(tokens, [])
    deltas = [f for f in fragments if isinstance(f, TextDelta)]
    first_text = next(i for i, f in enumerate(fragments) if isinstance(f, MessageStarted)) + 1
    assert len(deltas) == 1 and deltas[0].text == "plain words, then a split one"
    assert deltas[0].token_count == len(enc.encode("plain words, then a split one"))
    assert fragments[first_text] == deltas[0]

    splitter = harmony().splitter(ParseContext())
    splitter.feed(completion([assistant("final", "")])[:-1])  # into the message's content
    grammar = HarmonyGrammar(encoding())
    euro = "\u20ac".encode()

    def token_of(data):
        return next(token for token in range(256) if grammar.bytes_of(token) == data)

    a = token_of(b"a")
    split_euro = [token_of(euro[:1]), token_of(euro[1:2]), token_of(euro[2:])]
    assert splitter.feed([a, a, *split_euro, a]) == [TextDelta("aa", 0, 2), TextDelta("\u20ac", 4), TextDelta("a", 5)]


def test_function_call_header_carries_recipient_and_content_type():
    tokens = completion(
        [assistant("commentary", '{"city":"Paris"}', recipient="functions.get_weather", content_type="json")],
        end="<|call|>",
    )
    _, fragments = split_all(tokens, [])
    started = [f for f in fragments if isinstance(f, MessageStarted)]
    assert started[0].recipient == "functions.get_weather"
    assert "json" in (started[0].content_type or "")
    assert messages_of(fragments)[0][2] == '{"city":"Paris"}'


def test_cut_short_message_stays_open():
    tokens = completion([assistant("final", "a long answer that is cut")])[:6]
    fragments = harmony().splitter(ParseContext()).feed(tokens)
    assert isinstance(fragments[0], MessageStarted)
    assert not any(isinstance(f, MessageEnded) for f in fragments)


def test_grammar_violation_is_reported_not_raised():
    enc = encoding()
    tokens = completion([assistant("final", "ok")])
    # A <|message|> where a header is expected is not Harmony.
    bad = tokens + enc.encode("<|message|><|message|>", allowed_special="all")
    _, fragments = split_all(bad, [])
    assert any(isinstance(f, MalformedOutput) for f in fragments)
    assert messages_of(fragments)[0][2] == "ok"


def test_a_token_outside_the_vocabulary_in_a_header_is_reported_at_once():
    enc = encoding()
    tokens = completion([assistant("analysis", "thinking"), assistant("final", "ok")])
    second_header = tokens.index(enc.encode("<|start|>", allowed_special="all")[0]) + 1
    for unknown in (-1, 10**9):
        _, fragments = split_all([*tokens[:second_header], unknown, *tokens[second_header:]], [])
        assert messages_of(fragments) == [["analysis", None, "thinking"]]
        assert isinstance(fragments[-1], MalformedOutput) and str(unknown) in fragments[-1].detail


@settings(max_examples=60, deadline=None)
@given(
    reasoning=st.text(min_size=1, max_size=40),
    answer=st.text(min_size=1, max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12),
)
def test_any_batch_split_yields_the_same_text(reasoning, answer, cuts):
    tokens = completion([assistant("analysis", reasoning), assistant("final", answer)])
    _, whole = split_all(tokens, [])
    _, split = split_all(tokens, [c for c in cuts if c < len(tokens)])
    assert messages_of(split) == messages_of(whole)
    assert [m[2] for m in messages_of(whole)] == [reasoning, answer]


SPECIALS = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]
HEADER_WORDS = [" to=functions.get_weather", " to=browser.search", " <|constrain|>json", "commentary", "assistant",
                "user", " to=", "functions.x", " json", "final"]


class HarmonyReference:
    """The fragments as openai-harmony's StreamableParser reports them, token by token
    (a constraint it reads as a recipient is none, as the fragment vocabulary has it)."""

    def __init__(self, enc):
        from openai_harmony import Role, StreamableParser

        self.parser = StreamableParser(enc, Role.ASSISTANT)
        self.in_content = False
        self.channel = None
        self.reasoning_tokens = 0
        self.broken = False

    def feed(self, tokens):
        from openai_harmony import HarmonyError, StreamState

        fragments = []
        for index, token in enumerate(tokens):
            if self.broken:
                break
            try:
                self.parser.process(token)
            except HarmonyError as exc:
                self.broken = True
                fragments.append(MalformedOutput(str(exc)))
                break
            in_content = self.parser.state == StreamState.CONTENT
            if in_content and not self.in_content:
                self.channel = self.parser.current_channel
                fragments.append(MessageStarted(self.channel,
                                                normalized_recipient(self.parser.current_recipient, ParseContext()),
                                                self.parser.current_content_type))
            if in_content:
                self.reasoning_tokens += self.channel == "analysis"
                if self.parser.last_content_delta:
                    fragments.append(TextDelta(self.parser.last_content_delta, index))
            elif self.in_content:
                self.reasoning_tokens += self.channel == "analysis"
                fragments.append(MessageEnded())
                self.channel = None
            self.in_content = in_content
        return fragments


@settings(max_examples=300, deadline=None)
@given(
    texts=st.lists(st.text(max_size=12), min_size=1, max_size=4),
    channels=st.lists(st.sampled_from(["analysis", "commentary", "final"]), min_size=4, max_size=4),
    noise=st.lists(st.tuples(st.integers(min_value=0, max_value=120),
                             st.sampled_from(SPECIALS + HEADER_WORDS) | st.text(min_size=1, max_size=3)), max_size=4),
    raw=st.lists(st.tuples(st.integers(min_value=0, max_value=120), st.integers(min_value=0, max_value=200_000)),
                 max_size=2),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_fragments_are_what_harmony_own_parser_reads(texts, channels, noise, raw, cuts):
    """Framing is followed here and headers are read by Harmony: on any stream, well-formed
    or mangled (stray formatting tokens, header words, arbitrary tokens, characters split
    across tokens), and however it is cut into batches, the fragments must be exactly
    those Harmony's parser reports token by token."""
    enc = encoding()
    tokens = completion([assistant(channel, text) for channel, text in zip(channels, texts)])
    for position, piece in sorted(noise, reverse=True):
        tokens[position:position] = enc.encode(piece, allowed_special="all")
    for position, token in raw:
        tokens.insert(min(position, len(tokens)), token)
    reference = HarmonyReference(enc)
    expected = reference.feed(tokens)
    splitter, fragments = split_all(tokens, [c for c in cuts if c < len(tokens)])
    whole_splitter, whole = split_all(tokens, [])
    assert deltas_joined(whole) == deltas_joined(expected)
    assert whole_splitter.reasoning_tokens == reference.reasoning_tokens
    assert messages_of(fragments) == messages_of(expected)
    assert splitter.reasoning_tokens == reference.reasoning_tokens
