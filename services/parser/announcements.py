"""What the parser announces on core NATS for live tails once events are committed
(pure): the events themselves, in as few messages as fit the bus's size limit. An event
too large for any message (a snapshot of a long response) is announced by its sequence
number alone; tails read it from Postgres."""

from __future__ import annotations

from steno.schemas.events import CommittedEvents, LoggedEvent


def announcements(response_id: str, events: list[LoggedEvent], limit: int) -> list[bytes]:
    if not events:
        return []
    whole = CommittedEvents(response_id=response_id, events=events).model_dump_json().encode()
    if len(whole) <= limit:
        return [whole]
    messages: list[bytes] = []
    run: list[LoggedEvent] = []
    run_bytes = 0

    def close_run() -> None:
        nonlocal run, run_bytes
        if run:
            messages.append(CommittedEvents(response_id=response_id, events=run).model_dump_json().encode())
            run, run_bytes = [], 0

    envelope = len(CommittedEvents(response_id=response_id, events=[]).model_dump_json())
    for event in events:
        size = len(event.model_dump_json()) + 1
        if envelope + size > limit:
            close_run()
            messages.append(CommittedEvents(response_id=response_id, events=[], through_seq=event.seq)
                            .model_dump_json().encode())
            continue
        if envelope + run_bytes + size > limit:
            close_run()
        run.append(event)
        run_bytes += size
    close_run()
    return messages
