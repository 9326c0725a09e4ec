import pytest

from steno.services.api.truncation import Conversation, TurnSearch, turn_starts, without_oldest_turns


def user(text):
    return {"role": "user", "content": text}


def call(call_id):
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}


def output(call_id):
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


REASONING = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]}
ANSWER = {"role": "assistant", "content": "done"}
RULES = {"role": "developer", "content": "Be brief."}


def test_turns_start_at_user_messages_and_keep_calls_with_their_outputs():
    items = [user("1"), REASONING, call("a"), output("a"), ANSWER, user("2"), call("b"), user("interjection"),
             output("b"), ANSWER, user("3")]
    assert turn_starts(items) == [5, 10]


def test_leaving_out_turns_from_the_history_then_the_input_keeps_the_instructions():
    whole = Conversation(history=[user("1"), ANSWER, user("2"), ANSWER],
                         input=[RULES, user("3"), call("a"), output("a"), user("4")])
    kept, left_out = without_oldest_turns(whole, 1)
    assert kept == Conversation([user("2"), ANSWER], whole.input) and left_out == 2
    kept, left_out = without_oldest_turns(whole, 2)
    assert kept == Conversation([], whole.input) and left_out == 4
    kept, left_out = without_oldest_turns(whole, 3)
    assert kept == Conversation([], [RULES, user("4")]) and left_out == 7


def test_the_last_turn_is_never_left_out():
    whole = Conversation([], [user("only"), call("a"), output("a")])
    assert turn_starts(whole.items) == []
    with pytest.raises(IndexError):
        without_oldest_turns(whole, 1)


@pytest.mark.parametrize("needed", [0, 1, 2, 5, 9, 10, 11])
def test_the_search_finds_the_fewest_turns_that_fit(needed):
    whole = Conversation([], [item for turn in range(11) for item in (user(str(turn)), ANSWER)])
    search, tries = TurnSearch(whole), 0
    while (turns := search.next_try()) is not None:
        search.tried(turns, turns >= needed)
        tries += 1
    assert search.fewest == (max(needed, 1) if needed <= 10 else None)
    assert tries <= 4  # log2 of the 10 turns that can be left out
