import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from steno.services.dialects.chat_template.reasoning import Content, Reasoning, ThinkParser, partial_marker_length


def run(chunks, *, starts_inside=False, open_tag="<think>", close_tag="</think>"):
    parser = ThinkParser(open_tag, close_tag, starts_inside=starts_inside)
    pieces = []
    for chunk in chunks:
        pieces += parser.feed(chunk)
    return pieces + parser.finish()


def texts(pieces):
    reasoning = "".join(p.text for p in pieces if isinstance(p, Reasoning))
    content = "".join(p.text for p in pieces if isinstance(p, Content))
    return reasoning, content


def split(text, cuts):
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def reference(text, *, starts_inside, open_tag="<think>", close_tag="</think>"):
    """What the whole text means, read in one go: (reasoning, content)."""
    start = text.lstrip()
    if starts_inside:
        body = start[len(open_tag) :] if start.startswith(open_tag) else start
    elif start.startswith(open_tag):
        body = start[len(open_tag) :]
    else:
        return "", text
    end = body.find(close_tag)
    if end < 0:
        return body.strip(), ""
    return body[:end].strip(), body[end + len(close_tag) :].lstrip()


# -- golden cases ---------------------------------------------------------------------


def test_qwen3_output_that_opens_its_reasoning():
    pieces = run(["<think>\nThe user greets me.\n</think>\n\nHello!"])
    assert pieces == [Reasoning("The user greets me."), Content("Hello!")]


def test_output_without_reasoning_is_all_content_as_written():
    assert run(["  Hello, <think> is just text here."]) == [Content("  Hello, <think> is just text here.")]


def test_prompt_that_opened_the_reasoning():
    pieces = run(["Let me think.\n</think>\n\nThe answer."], starts_inside=True)
    assert pieces == [Reasoning("Let me think."), Content("The answer.")]


def test_stray_open_tag_at_the_start_is_dropped():
    pieces = run(["\n<think>\nhmm\n</think>ok"], starts_inside=True)
    assert pieces == [Reasoning("hmm"), Content("ok")]


def test_open_tag_later_in_the_reasoning_is_text():
    assert texts(run(["a <think> b</think>c"], starts_inside=True)) == ("a <think> b", "c")


def test_everything_after_the_close_tag_is_content_tags_included():
    assert texts(run(["<think>r</think> x </think> <think>y"])) == ("r", "x </think> <think>y")


def test_reasoning_cut_short_is_all_reasoning():
    assert run(["<think>\nStill thinking about it"]) == [Reasoning("Still thinking about it")]
    assert run(["Still thinking\n\n"], starts_inside=True) == [Reasoning("Still thinking")]


def test_empty_reasoning_emits_nothing_empty():
    assert run(["<think>\n\n</think>\n\nHi"]) == [Content("Hi")]
    assert run(["</think>Hi"], starts_inside=True) == [Content("Hi")]
    assert run([""]) == []
    assert run(["<think></think>"]) == []


def test_partial_close_tag_is_held_back():
    parser = ThinkParser(starts_inside=True)
    assert parser.feed("abc</thi") == [Reasoning("abc")]
    assert parser.feed("nk>\n") == []
    assert parser.feed("done") == [Content("done")]
    assert parser.finish() == []


def test_text_that_only_looks_like_a_tag_is_released():
    parser = ThinkParser(starts_inside=True)
    assert parser.feed("a </th") == [Reasoning("a")]
    assert parser.feed("ing") == [Reasoning(" </thing")]
    assert parser.finish() == []


def test_partial_open_tag_is_held_until_decided():
    parser = ThinkParser()
    assert parser.feed("  <thi") == []
    assert parser.feed("s is text") == [Content("  <this is text")]
    parser = ThinkParser()
    assert parser.feed("<thi") == []
    assert parser.finish() == [Content("<thi")]


def test_trailing_whitespace_of_reasoning_waits_for_more_reasoning():
    parser = ThinkParser(starts_inside=True)
    assert parser.feed("one\n\n") == [Reasoning("one")]
    assert parser.feed("two") == [Reasoning("\n\ntwo")]
    assert parser.feed("\n</think>\n") == []
    assert parser.feed("\nthree") == [Content("three")]


def test_non_ascii_split_anywhere():
    text = "<think>Déjà vu, 日本 🎉</think>\n答え 🎉"
    for size in (1, 2, 3):
        assert texts(run([text[i : i + size] for i in range(0, len(text), size)])) == ("Déjà vu, 日本 🎉", "答え 🎉")


def test_same_kind_pieces_of_one_feed_are_merged():
    assert run(["<think>a", "b"]) == [Reasoning("a"), Reasoning("b")]
    parser = ThinkParser()
    assert parser.feed("<think>a\nb</think>c\nd") == [Reasoning("a\nb"), Content("c\nd")]


def test_other_tags():
    pieces = run(["<seed:think>x</seed:think>y"], open_tag="<seed:think>", close_tag="</seed:think>")
    assert pieces == [Reasoning("x"), Content("y")]


def test_empty_tags_are_refused():
    with pytest.raises(ValueError):
        ThinkParser("", "</think>")


def test_partial_marker_length():
    assert partial_marker_length("abc</thi", "</think>") == 5
    assert partial_marker_length("abc<", "</think>") == 1
    assert partial_marker_length("abc", "</think>") == 0
    # A whole marker is not partial: the caller found it already.
    assert partial_marker_length("</think>", "</think>") == 0


def test_plain_text_stays_linear():
    parser = ThinkParser(starts_inside=True)
    chunk = "word < and </ more\n "
    started = time.perf_counter()
    for _ in range(100_000):
        parser.feed(chunk)
    parser.feed("</think>")
    for _ in range(100_000):
        parser.feed(chunk)
    parser.finish()
    assert time.perf_counter() - started < 5


def test_long_run_of_whitespace_stays_linear():
    parser = ThinkParser(starts_inside=True)
    parser.feed("x")
    started = time.perf_counter()
    for _ in range(100_000):
        parser.feed("\n\n")
    assert parser.feed("y") == [Reasoning("\n" * 200_000 + "y")]
    assert time.perf_counter() - started < 5


# -- properties -----------------------------------------------------------------------

FRAGMENTS = ["<think>", "</think>", "<", "</", "<th", "</thi", "think>", ">"]
FRAGMENTS += ["a", "Déjà", "日本", "🎉", " ", "\n", "\n\n"]
outputs = st.lists(st.sampled_from(FRAGMENTS), max_size=25).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=outputs, starts_inside=st.booleans(), data=st.data())
def test_any_split_reads_as_the_whole_text(text, starts_inside, data):
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    whole = run([text], starts_inside=starts_inside)
    pieces = run(split(text, cuts), starts_inside=starts_inside)
    assert texts(pieces) == texts(whole) == reference(text, starts_inside=starts_inside)
    assert all(piece.text for piece in pieces)


@settings(max_examples=200, deadline=None)
@given(text=outputs, starts_inside=st.booleans())
def test_one_character_at_a_time(text, starts_inside):
    assert texts(run(list(text), starts_inside=starts_inside)) == reference(text, starts_inside=starts_inside)


@settings(max_examples=300, deadline=None)
@given(text=outputs, data=st.data())
def test_reasoning_is_given_out_as_soon_as_it_is_known(text, data):
    """Until the close tag, all the reasoning fed so far is out, but for a possible
    partial tag and trailing whitespace."""
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    parser = ThinkParser(starts_inside=True)
    fed, reasoning = "", ""
    for chunk in split(text, cuts):
        fed += chunk
        reasoning += "".join(p.text for p in parser.feed(chunk) if isinstance(p, Reasoning))
        if "</think>" in fed:
            break
        start = fed.lstrip()
        if len(start) < len("<think>") and "<think>".startswith(start):
            expected = ""
        else:
            body = start.removeprefix("<think>")
            expected = body[: len(body) - partial_marker_length(body, "</think>")].strip()
        assert reasoning == expected
