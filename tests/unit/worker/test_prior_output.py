from steno.schemas.bus import GenerationEnded, TokenBatch
from steno.services.worker.prior_output import assemble


def batch(attempt, number, tokens, resumed_after=None):
    return TokenBatch(response_id="r", attempt=attempt, batch_no=number, token_ids=tokens, resumed_after=resumed_after)


def ended(attempt, count, total):
    return GenerationEnded(response_id="r", attempt=attempt, batch_count=count, finish_reason="stop",
                           prompt_tokens=1, output_tokens=total)


def test_nothing_published():
    assert assemble([]).token_ids == [] and not assemble([]).ended


def test_one_attempt_cut_short():
    prior = assemble([batch(0, 0, [1, 2]), batch(0, 1, [3])])
    assert prior.token_ids == [1, 2, 3] and not prior.ended


def test_attempts_continue_each_other_and_duplicates_are_ignored():
    prior = assemble([batch(0, 0, [1]), batch(0, 0, [1]), batch(1, 0, [2], resumed_after=1), batch(1, 1, [3])])
    assert prior.token_ids == [1, 2, 3]


def test_late_batch_of_a_superseded_attempt_is_ignored():
    prior = assemble([batch(0, 0, [1]), batch(1, 0, [2], resumed_after=1), batch(0, 1, [9])])
    assert prior.token_ids == [1, 2]


def test_an_end_means_there_is_nothing_to_continue():
    assert assemble([batch(0, 0, [1]), ended(0, 1, 1)]).ended


def test_a_diverged_takeover_ends_it():
    assert assemble([batch(0, 0, [1, 2]), batch(1, 0, [5], resumed_after=1)]).ended


def test_a_last_batch_carrying_its_end_ends_it_with_its_tokens():
    last = batch(0, 1, [2]).model_copy(update={"ended": ended(0, 2, 2)})
    prior = assemble([batch(0, 0, [1]), last])
    assert prior.token_ids == [1, 2] and prior.ended
