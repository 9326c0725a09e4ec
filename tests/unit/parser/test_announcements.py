from steno.schemas.events import CommittedEvents, LoggedEvent
from steno.services.parser.announcements import announcements

RID = "resp_announce"


def event(seq: int, size: int) -> LoggedEvent:
    return LoggedEvent(seq=seq, type="response.output_text.delta", payload='{"delta":"' + "x" * size + '"}')


def decoded(messages: list[bytes]) -> list[CommittedEvents]:
    return [CommittedEvents.model_validate_json(message) for message in messages]


def test_events_that_fit_go_in_one_message():
    events = [event(seq, 100) for seq in range(1, 6)]
    (only,) = decoded(announcements(RID, events, limit=64 * 1024))
    assert only.events == events and only.through_seq is None


def test_events_are_split_to_fit_and_one_too_large_is_announced_by_its_number():
    events = [event(1, 300), event(2, 300), event(3, 5000), event(4, 300), event(5, 300)]
    messages = announcements(RID, events, limit=1000)
    assert all(len(message) <= 1000 for message in messages)
    carried = [e.seq for m in decoded(messages) for e in m.events]
    notices = [m.through_seq for m in decoded(messages) if m.through_seq is not None]
    assert carried == [1, 2, 4, 5] and notices == [3]
    order = [m.through_seq if m.through_seq is not None else m.events[0].seq for m in decoded(messages)]
    assert order == sorted(order)  # a tail meets them in sequence


def test_nothing_to_announce():
    assert announcements(RID, [], limit=1000) == []
