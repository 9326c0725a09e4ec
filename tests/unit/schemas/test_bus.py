from hypothesis import given, settings
from hypothesis import strategies as st

from steno.schemas.bus import (
    GenerationEnded,
    GroupedBatch,
    ParserSeed,
    Placement,
    TokenBatch,
    TokenBatchGroup,
    TokenStreamOrder,
    stream_position,
    token_batch_json,
    token_partition_message,
    unpacked,
)

RID = "resp_order"


def batch(attempt: int, number: int, tokens: int = 2, resumed_after: int | None = None) -> TokenBatch:
    return TokenBatch(response_id=RID, attempt=attempt, batch_no=number, token_ids=[1] * tokens,
                      resumed_after=resumed_after)


def end(attempt: int, count: int) -> GenerationEnded:
    return GenerationEnded(response_id=RID, attempt=attempt, batch_count=count, finish_reason="stop",
                           prompt_tokens=1, output_tokens=0)


def test_batches_apply_in_order_and_what_was_applied_is_a_duplicate():
    order = TokenStreamOrder()
    assert order.place(batch(0, 1)) is Placement.AHEAD
    assert order.place(batch(0, 0)) is Placement.NEXT
    order.advance(batch(0, 0))
    assert order.place(batch(0, 0)) is Placement.DUPLICATE
    assert order.place(batch(0, 1)) is Placement.NEXT
    assert (order.next_batch_no, order.output_tokens) == (1, 2)


def test_a_later_attempt_starts_at_zero_and_must_continue_after_every_token():
    order = TokenStreamOrder()
    order.advance(batch(0, 0, tokens=3))
    assert order.place(batch(1, 1, resumed_after=3)) is Placement.AHEAD
    assert order.place(batch(1, 0, resumed_after=2)) is Placement.DIVERGED
    assert order.place(batch(1, 0, resumed_after=3)) is Placement.NEXT
    order.advance(batch(1, 0, resumed_after=3))
    assert order.place(batch(0, 1)) is Placement.DUPLICATE  # the earlier attempt is over
    assert (order.attempt, order.next_batch_no, order.output_tokens) == (1, 1, 5)


def test_messages_sort_into_stream_order_an_end_after_its_attempts_last_batch():
    arrived = [batch(1, 0, resumed_after=2), end(0, 2), batch(0, 1), batch(0, 0)]
    assert [stream_position(message) for message in sorted(arrived, key=stream_position)] == [
        (0, 0), (0, 1), (0, 2), (1, 0)]
    assert isinstance(sorted(arrived, key=stream_position)[2], GenerationEnded)


def test_an_end_counts_as_the_attempts_next_number_and_nothing_follows_it():
    order = TokenStreamOrder()
    order.advance(batch(0, 0))
    assert order.place(end(0, 2)) is Placement.AHEAD
    assert order.place(end(0, 1)) is Placement.NEXT
    order.advance(end(0, 1))
    assert order.ended
    assert order.place(batch(1, 0)) is Placement.DUPLICATE


def test_a_partition_message_unpacks_into_the_token_stream_messages_it_carries():
    alone = token_partition_message.validate_json(end(0, 1).model_dump_json())
    assert unpacked(alone, {"Steno-Tenant": "a"}) == [(end(0, 1), {"Steno-Tenant": "a"})]
    other = TokenBatch(response_id="resp_other", attempt=0, batch_no=4, token_ids=[9])
    group = TokenBatchGroup(batches=[GroupedBatch(batch=batch(0, 0), headers={"traceparent": "00-ab"}),
                                     GroupedBatch(batch=other)])
    decoded = token_partition_message.validate_json(group.model_dump_json())
    assert unpacked(decoded, {"ignored": "the group's own"}) == [(batch(0, 0), {"traceparent": "00-ab"}), (other, {})]


# Floats as an engine may give them, the infinite and undefined included (the model writes
# those as null, and so must the batch written without it).
_floats = st.floats(allow_nan=True, allow_infinity=True)
# A seed as the API writes it (``GenerationRequest.seed_parser``).
_seeds = st.none() | st.builds(
    ParserSeed, base_snapshot=st.dictionaries(st.text(), st.none() | st.text() | _floats | st.integers()),
    parse_context=st.just({}), chain_head=st.none() | st.text(),
).map(lambda seed: seed.model_dump_json(exclude_none=True))
_ends = st.none() | st.builds(GenerationEnded, response_id=st.just(RID), attempt=st.integers(0, 3),
                              batch_count=st.integers(0, 9), finish_reason=st.sampled_from(["stop", "length"]))


@settings(max_examples=400)
@given(st.text(), st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1), st.lists(st.integers(0, 2**31 - 1)),
       st.none() | st.integers(0, 2**31 - 1), st.none() | st.lists(_floats),
       st.none() | st.lists(st.lists(st.tuples(st.integers(0, 2**31 - 1), _floats), max_size=3)),
       _seeds, _ends, st.none() | _floats, st.none() | _floats)
def test_a_batch_written_without_its_model_is_the_models_bytes(
        response_id, attempt, batch_no, token_ids, resumed_after, logprobs, top_logprobs, parser_seed_json, ended,
        emitted_at, first_emitted_at):
    fields = {"resumed_after": resumed_after, "logprobs": logprobs, "top_logprobs": top_logprobs, "ended": ended,
              "emitted_at": emitted_at, "first_emitted_at": first_emitted_at}
    written = token_batch_json(response_id, attempt, batch_no, token_ids, parser_seed_json=parser_seed_json, **fields)
    parser_seed = None if parser_seed_json is None else ParserSeed.model_validate_json(parser_seed_json)
    model = TokenBatch(response_id=response_id, attempt=attempt, batch_no=batch_no, token_ids=token_ids,
                       parser_seed=parser_seed, **fields)
    assert written == model.model_dump_json(exclude_none=True).encode()
