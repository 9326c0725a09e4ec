"""What the parser announces on core NATS for live tails once a commit is in (pure): one
``AnnouncedEvents`` message per API process that made or follows any of the commit's
responses (more only where they would exceed the bus's size limit), carrying each
response's events. An event too large for any message (a snapshot of a long response)
is announced by its sequence number alone; tails read it from Postgres."""

from __future__ import annotations

from collections.abc import Iterable

from steno.schemas.events import AnnouncedEvents, LoggedEvent, committed_events_json, logged_event_json

# ``AnnouncedEvents`` around its entries, each already encoded as ``CommittedEvents``.
_BEFORE, _AFTER = AnnouncedEvents(committed=[]).model_dump_json().encode().split(b"[]")
_OPEN, _CLOSE = _BEFORE + b"[", b"]" + _AFTER
_ENVELOPE_BYTES = len(_OPEN) + len(_CLOSE)


class Announcements:
    """A commit's announcements, gathered response by response, by destination."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._entries: dict[str, list[bytes]] = {}

    def add(self, response_id: str, events: list[LoggedEvent], destinations: Iterable[str]) -> None:
        entries = committed_entries(response_id, events, self._limit - _ENVELOPE_BYTES)
        if entries:
            for destination in destinations:
                self._entries.setdefault(destination, []).extend(entries)

    def messages(self) -> list[tuple[str, bytes]]:
        """(destination, message) pairs; each message is at most the limit."""
        messages: list[tuple[str, bytes]] = []
        for destination, entries in self._entries.items():
            run: list[bytes] = []
            size = _ENVELOPE_BYTES
            for entry in entries:
                if run and size + 1 + len(entry) > self._limit:
                    messages.append((destination, _OPEN + b",".join(run) + _CLOSE))
                    run, size = [], _ENVELOPE_BYTES
                run.append(entry)
                size += len(entry) + 1
            messages.append((destination, _OPEN + b",".join(run) + _CLOSE))
        return messages


def committed_entries(response_id: str, events: list[LoggedEvent], limit: int) -> list[bytes]:
    """The events as ``CommittedEvents`` in as few entries as fit ``limit`` bytes each."""
    if not events:
        return []
    whole = committed_events_json(response_id, events)
    if len(whole) <= limit:
        return [whole]
    entries: list[bytes] = []
    run: list[LoggedEvent] = []
    run_bytes = 0

    def close_run() -> None:
        nonlocal run, run_bytes
        if run:
            entries.append(committed_events_json(response_id, run))
            run, run_bytes = [], 0

    envelope = len(committed_events_json(response_id, []))
    for event in events:
        size = len(logged_event_json(event)) + 1
        if envelope + size > limit:
            close_run()
            entries.append(committed_events_json(response_id, [], through_seq=event.seq))
            continue
        if envelope + run_bytes + size > limit:
            close_run()
        run.append(event)
        run_bytes += size
    close_run()
    return entries
