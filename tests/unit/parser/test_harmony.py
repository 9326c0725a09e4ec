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
