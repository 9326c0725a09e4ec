from pydantic import TypeAdapter

from steno.schemas.events import CommittedEvents, LoggedEvent, committed_in
from steno.services.parser.announcements import Announcements, committed_entries

RID = "resp_announce"


def event(seq: int, size: int) -> LoggedEvent:
    return LoggedEvent(seq=seq, type="response.output_text.delta", payload='{"delta":"' + "x" * size + '"}')


def decoded(entries: list[bytes]) -> list[CommittedEvents]:
    return [TypeAdapter(CommittedEvents).validate_json(entry) for entry in entries]


def received(messages: list[tuple[str, bytes]]) -> dict[str, list[list[CommittedEvents]]]:
    """What each destination receives: its messages, each decoded as the API decodes it."""
    by_destination: dict[str, list[list[CommittedEvents]]] = {}
    for destination, message in messages:
        by_destination.setdefault(destination, []).append(committed_in(message))
    return by_destination


def test_events_that_fit_go_in_one_entry():
    events = [event(seq, 100) for seq in range(1, 6)]
    (only,) = decoded(committed_entries(RID, events, limit=64 * 1024))
    assert only.events == events and only.through_seq is None


def test_events_are_split_to_fit_and_one_too_large_is_announced_by_its_number():
    events = [event(1, 300), event(2, 300), event(3, 5000), event(4, 300), event(5, 300)]
    entries = committed_entries(RID, events, limit=1000)
    assert all(len(entry) <= 1000 for entry in entries)
    carried = [e.seq for m in decoded(entries) for e in m.events]
    notices = [m.through_seq for m in decoded(entries) if m.through_seq is not None]
    assert carried == [1, 2, 4, 5] and notices == [3]
    order = [m.through_seq if m.through_seq is not None else m.events[0].seq for m in decoded(entries)]
    assert order == sorted(order)  # a tail meets them in sequence


def test_nothing_to_announce():
    assert committed_entries(RID, [], limit=1000) == []
    announcing = Announcements(limit=1000)
    announcing.add(RID, [], ["origin-a"])
    assert announcing.messages() == []


def test_a_commit_is_one_message_per_destination_with_each_response_it_follows():
    announcing = Announcements(limit=64 * 1024)
    first, second, third = [event(seq, 20) for seq in range(3)], [event(7, 20)], [event(1, 20), event(2, 20)]
    announcing.add("resp_first", first, ["a"])
    announcing.add("resp_second", second, ["b"])
    announcing.add("resp_third", third, ["a", "b"])  # made by a, followed from b
    by_destination = received(announcing.messages())
    assert {d: [[(c.response_id, c.events) for c in m] for m in ms] for d, ms in by_destination.items()} == {
        "a": [[("resp_first", first), ("resp_third", third)]],
        "b": [[("resp_second", second), ("resp_third", third)]],
    }


def test_a_commit_too_large_for_one_message_is_split_between_responses_within_the_limit():
    announcing = Announcements(limit=1000)
    for n in range(6):
        announcing.add(f"resp_{n}", [event(1, 300), event(2, 300)], ["a"])
    announcing.add("resp_huge", [event(1, 300), event(2, 5000), event(3, 300)], ["a"])
    messages = announcing.messages()
    assert len(messages) > 1 and all(len(message) <= 1000 for _, message in messages)
    entries = [c for m in received(messages)["a"] for c in m]
    # Every response's events arrive once, in order, the one too large by its number.
    carried: dict[str, list[int]] = {}
    for entry in entries:
        carried.setdefault(entry.response_id, []).extend(
            [e.seq for e in entry.events] or [entry.through_seq or -1])
    assert carried == {**{f"resp_{n}": [1, 2] for n in range(6)}, "resp_huge": [1, 2, 3]}
