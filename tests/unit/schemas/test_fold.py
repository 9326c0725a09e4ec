import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from steno.schemas.bus import GenerationEnded, TokenBatch
from steno.schemas.fold import fold
from steno.schemas.responses import ParseContext
from steno.services.parser.response_state import ResponseState
from tests.harmony_samples import assistant, completion

BASE = {"id": "resp_fold", "object": "response", "created_at": 1, "model": "m", "output": [],
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}

text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30)
message = st.one_of(
    st.builds(lambda t: assistant("analysis", t), text),
    st.builds(lambda t: assistant("final", t), text),
    st.builds(lambda t: assistant("commentary", t), text),
    st.builds(
        lambda name, args: assistant("commentary", args, recipient=f"functions.{name}", content_type="json"),
        st.sampled_from(["lookup", "get_weather"]),
        text,
    ),
)


@settings(max_examples=80, deadline=None)
@given(
    conversation=st.lists(message, min_size=1, max_size=4),
    sizes=st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=40),
    cut=st.one_of(st.none(), st.integers(min_value=1, max_value=60)),
    finish=st.sampled_from(["stop", "length", "cancelled", "error"]),
)
def test_fold_of_events_is_the_final_snapshot(conversation, sizes, cut, finish):
    tokens = completion(conversation)
    if cut is not None:
        tokens = tokens[:cut]
    state = ResponseState("resp_fold", BASE, ParseContext())
    payloads, start, batch_no = [], 0, 0
    while start < len(tokens):
        size = sizes[batch_no % len(sizes)]
        applied = state.apply_batch(
            TokenBatch(response_id="resp_fold", attempt=0, batch_no=batch_no, token_ids=tokens[start:start + size])
        )
        payloads += [orjson.loads(e.payload) for e in applied.events]
        start += size
        batch_no += 1
    ended = GenerationEnded(response_id="resp_fold", attempt=0, batch_count=batch_no, finish_reason=finish,
                            prompt_tokens=1, output_tokens=len(tokens))
    payloads += [orjson.loads(e.payload) for e in state.apply_end(ended).events]
    assert [p["sequence_number"] for p in payloads] == list(range(1, len(payloads) + 1))
    assert fold(payloads) == state.final_snapshot
    # Every item the stream opened was closed.
    added = [p["output_index"] for p in payloads if p["type"] == "response.output_item.added"]
    done = [p["output_index"] for p in payloads if p["type"] == "response.output_item.done"]
    assert added == done


def test_fold_of_an_unfinished_log_shows_partial_output():
    tokens = completion([assistant("final", "partial text here")])
    state = ResponseState("resp_fold", BASE, ParseContext())
    events = state.apply_batch(TokenBatch(response_id="resp_fold", attempt=0, batch_no=0, token_ids=tokens[:6])).events
    folded = fold(orjson.loads(e.payload) for e in events)
    assert folded["status"] == "in_progress"
    assert folded["output"][0]["status"] == "in_progress"
    assert "partial text here".startswith(folded["output"][0]["content"][0]["text"])
    assert folded["output"][0]["content"][0]["text"]
