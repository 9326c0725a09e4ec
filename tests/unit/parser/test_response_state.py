import random

import orjson
import pytest

from steno.schemas.bus import GenerationEnded, TokenBatch
from steno.schemas.fold import fold
from steno.schemas.responses import ParseContext, ReasoningSealing
from steno.services.common.reasoning_seal import ReasoningSeal, SealingKey
from steno.services.parser.response_state import OutOfOrder, ResponseState
from tests.events_oracle import validate_events, validate_response
from tests.harmony_samples import assistant, completion, encoding
from tests.parse_support import BASE, RID, batches, run


def payloads(events):
    return [orjson.loads(e.payload) for e in events]


def test_reasoning_and_answer_events_in_sdk_shape():
    tokens = completion([assistant("analysis", "Thinking."), assistant("final", "Hello!")])
    state, events = run(tokens, [3] * 20)
    parsed = validate_events([e.payload for e in events])
    types = [e.type for e in parsed]
    assert types[0] == "response.in_progress"
    assert types[1:4] == ["response.output_item.added", "response.content_part.added", "response.reasoning_text.delta"]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in parsed] == list(range(1, len(parsed) + 1))
    final = validate_response(state.final_snapshot)
    assert final.status == "completed"
    assert final.output[0].type == "reasoning" and final.output[0].content[0].text == "Thinking."
    assert final.output_text == "Hello!"
    assert final.usage.output_tokens_details.reasoning_tokens > 0
    assert fold(payloads(list(events))) == state.final_snapshot | {"output": state.final_snapshot["output"]}


def test_same_batches_give_byte_identical_events():
    tokens = completion([assistant("analysis", "Déjà vu 日本"), assistant("final", "Same again.")])
    _, first = run(tokens, [2, 5, 1, 7])
    _, second = run(tokens, [2, 5, 1, 7])
    assert [e.payload for e in first] == [e.payload for e in second]


def test_split_inside_multibyte_character_keeps_text_whole():
    tokens = completion([assistant("final", "日本語のテキスト 🎉")])
    state, events = run(tokens, [1] * len(tokens))
    assert validate_response(state.final_snapshot).output_text == "日本語のテキスト 🎉"
    deltas = "".join(p["delta"] for p in payloads(events) if p["type"] == "response.output_text.delta")
    assert deltas == "日本語のテキスト 🎉"


def test_length_finish_is_incomplete_with_incomplete_items():
    tokens = completion([assistant("analysis", "A rather long line of reasoning here")])[:8]
    state, events = run(tokens, [4, 4], finish="length")
    final = validate_response(state.final_snapshot)
    assert final.status == "incomplete"
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.output[0].status == "incomplete"
    assert events[-1].type == "response.incomplete"


def test_engine_error_fails_visibly():
    state = ResponseState(RID, BASE, ParseContext())
    ended = GenerationEnded(
        response_id=RID, attempt=0, batch_count=0, finish_reason="error", prompt_tokens=3, output_tokens=0,
        error_code="server_error", error_message="engine died",
    )
    events = state.apply_end(ended).events
    assert [e.type for e in events] == ["response.in_progress", "error", "response.failed"]
    validate_events([e.payload for e in events])
    assert state.final_snapshot["error"] == {"code": "server_error", "message": "engine died"}


def test_cancel_ends_completed_event_with_cancelled_status():
    tokens = completion([assistant("final", "partial answer")])[:5]
    state, events = run(tokens, [5], finish="cancelled")
    assert events[-1].type == "response.completed"
    assert validate_response(state.final_snapshot).status == "cancelled"


def test_function_call_item():
    tokens = completion(
        [assistant("commentary", '{"city": "Paris"}', recipient="functions.get_weather", content_type="json")],
        end="<|call|>",
    )
    state, events = run(tokens, [3] * 10)
    validate_events([e.payload for e in events])
    call = validate_response(state.final_snapshot).output[0]
    assert call.type == "function_call"
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")


def test_logprobs_ride_on_text_deltas_when_asked():
    tokens = completion([assistant("final", "Hi there")])
    _state, events = run(tokens, [100], context=ParseContext(include_logprobs=True), logprobs=True)
    parsed = validate_events([e.payload for e in events])
    deltas = [e for e in parsed if e.type == "response.output_text.delta"]
    assert sum(len(d.logprobs) for d in deltas) == len(encoding().encode("Hi there"))
    assert "".join(lp.token for d in deltas for lp in d.logprobs) == "Hi there"


def test_redelivered_batch_is_a_duplicate_and_gap_is_out_of_order():
    tokens = completion([assistant("final", "one two three four")])
    sent = batches(tokens, [2, 2, 2])
    state = ResponseState(RID, BASE, ParseContext())
    assert state.apply_batch(sent[0]) is not None
    assert state.apply_batch(sent[0]) is None
    with pytest.raises(OutOfOrder):
        state.apply_batch(sent[2])


def test_has_applied_tells_a_redelivery_from_what_comes_next_or_later_without_applying():
    tokens = completion([assistant("final", "one two three four")])
    sent = batches(tokens, [2, 2, 2])
    state = ResponseState(RID, BASE, ParseContext())
    state.apply_batch(sent[0])
    assert state.has_applied(sent[0])
    assert not state.has_applied(sent[1])
    assert not state.has_applied(sent[2])
    assert not state.has_applied(sent[1])  # telling applied nothing
    assert state.apply_batch(sent[1]) is not None


def test_random_splits_fold_to_the_same_snapshot():
    tokens = completion([assistant("analysis", "x" * 50), assistant("final", "y z " * 30)])
    rng = random.Random(7)
    snapshots = set()
    for _ in range(10):
        sizes = [rng.randint(1, 9) for _ in range(len(tokens))]
        state, events = run(tokens, sizes)
        assert fold(payloads(events)) == state.final_snapshot
        snapshots.add(orjson.dumps(state.final_snapshot))
    assert len(snapshots) == 1


def test_empty_batches_are_numbered_keepalives():
    tokens = completion([assistant("final", "slow answer")])
    state = ResponseState(RID, BASE, ParseContext())
    empty = lambda n: TokenBatch(response_id=RID, attempt=0, batch_no=n, token_ids=[])  # noqa: E731
    events = state.apply_batch(empty(0)).events + state.apply_batch(empty(1)).events
    events += state.apply_batch(TokenBatch(response_id=RID, attempt=0, batch_no=2, token_ids=tokens)).events
    events += state.apply_batch(empty(3)).events
    parsed = validate_events([e.payload for e in events])
    assert [e.type for e in parsed][:2] == ["response.in_progress", "response.in_progress"]
    assert parsed[-1].type == "response.in_progress"
    assert [e.sequence_number for e in parsed] == list(range(1, len(parsed) + 1))


def test_a_last_batch_carrying_its_end_is_the_batch_then_the_end():
    tokens = completion([assistant("analysis", "Weigh it."), assistant("final", "Done, déjà.")])
    _, separate = run(tokens, [4, 4, 100])
    state = ResponseState(RID, BASE, ParseContext())
    sent = batches(tokens, [4, 4, 100])
    ended = GenerationEnded(response_id=RID, attempt=0, batch_count=len(sent), finish_reason="stop",
                            prompt_tokens=10, output_tokens=len(tokens))
    sent[-1] = sent[-1].model_copy(update={"ended": ended})
    carried = [event for batch in sent for event in state.apply(batch).events]
    assert [e.payload for e in carried] == [e.payload for e in separate]
    assert state.finished and state.apply(sent[-1]) is None  # redelivered: a duplicate


SEAL = ReasoningSeal([SealingKey("k1", bytes(32))])
SEALED = ParseContext(reasoning_sealing=ReasoningSealing(key_id="k1", tenant="acme"))


def test_sealed_reasoning_carries_its_text_as_encrypted_content_that_opens_for_its_tenant():
    tokens = completion([assistant("analysis", "Secret plan."), assistant("final", "Hi.")])
    state, events = run(tokens, [3] * 20, context=SEALED, seal=SEAL)
    reasoning = validate_response(state.final_snapshot).output[0]
    assert SEAL.open(reasoning.encrypted_content, tenant="acme") == "Secret plan."
    done = [p["item"] for p in payloads(events) if p["type"] == "response.output_item.done"]
    assert done[0]["encrypted_content"] == reasoning.encrypted_content
    again, _ = run(tokens, [1] * 40, context=SEALED, seal=SEAL)
    assert again.final_snapshot["output"] == state.final_snapshot["output"]  # re-parsed: the same blob
    unsealed, _ = run(tokens, [3] * 20)
    assert "encrypted_content" not in unsealed.final_snapshot["output"][0]


def test_a_response_sealed_with_a_key_no_longer_held_fails_visibly():
    tokens = completion([assistant("analysis", "Secret plan."), assistant("final", "Hi.")])
    state = ResponseState(RID, BASE, SEALED, seal=ReasoningSeal([SealingKey("k2", bytes(32))]))
    applied = state.apply_batch(batches(tokens, [len(tokens)])[0])
    assert state.finished and applied.events[-1].type == "response.failed"
    assert "not held" in validate_response(state.final_snapshot).error.message
    assert not any("Secret" in e.payload for e in applied.events)
