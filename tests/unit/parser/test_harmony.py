from hypothesis import given, settings
from hypothesis import strategies as st

from services.parser.harmony import HarmonyStreamSplitter, MalformedOutput, MessageEnded, MessageStarted, TextDelta
from tests.harmony_samples import assistant, completion, encoding


def split_all(tokens, cuts):
    splitter = HarmonyStreamSplitter(encoding())
    fragments, start = [], 0
    for cut in sorted(set(cuts)) + [len(tokens)]:
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


def test_reasoning_then_answer():
    tokens = completion([assistant("analysis", "Let me think."), assistant("final", "Hi there!")])
    splitter, fragments = split_all(tokens, [])
    assert messages_of(fragments) == [["analysis", None, "Let me think."], ["final", None, "Hi there!"]]
    assert sum(isinstance(f, MessageEnded) for f in fragments) == 2
    # <|message|>, the text, and the closing <|end|>
    assert splitter.reasoning_tokens == len(encoding().encode("Let me think.")) + 2


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
    splitter = HarmonyStreamSplitter(encoding())
    fragments = splitter.feed(tokens)
    assert isinstance(fragments[0], MessageStarted)
    assert not any(isinstance(f, MessageEnded) for f in fragments)
    assert splitter.in_message


def test_grammar_violation_is_reported_not_raised():
    enc = encoding()
    tokens = completion([assistant("final", "ok")])
    # A <|message|> where a header is expected is not Harmony.
    bad = tokens + enc.encode("<|message|><|message|>", allowed_special="all")
    _, fragments = split_all(bad, [])
    assert any(isinstance(f, MalformedOutput) for f in fragments)
    assert messages_of(fragments)[0][2] == "ok"


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


@settings(max_examples=150, deadline=None)
@given(
    texts=st.lists(st.text(max_size=12), min_size=1, max_size=4),
    channels=st.lists(st.sampled_from(["analysis", "commentary", "final"]), min_size=4, max_size=4),
    noise=st.lists(st.tuples(st.integers(min_value=0, max_value=120), st.sampled_from(SPECIALS)), max_size=3),
)
def test_message_boundaries_follow_harmony_own_state(texts, channels, noise):
    """Where a message's content starts and ends is tracked from the tokens; it must agree
    with Harmony's parser on every token, in well-formed output and in output with stray
    formatting tokens."""
    from openai_harmony import HarmonyError, Role, StreamableParser, StreamState

    enc = encoding()
    tokens = completion([assistant(channel, text) for channel, text in zip(channels, texts)])
    for position, special in sorted(noise, reverse=True):
        tokens[position:position] = enc.encode(special, allowed_special="all")
    reference = StreamableParser(enc, Role.ASSISTANT)
    splitter = HarmonyStreamSplitter(enc)
    for token in tokens:
        fragments = splitter.feed([token])
        try:
            reference.process(token)
        except HarmonyError:
            assert any(isinstance(f, MalformedOutput) for f in fragments)
            return
        assert splitter.in_message == (reference.state == StreamState.CONTENT)
