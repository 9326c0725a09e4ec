from typing import get_args

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from steno.schemas.events import (
    EVENT_TYPES,
    TERMINAL_EVENT_TYPES,
    AnnouncedEvents,
    CommittedEvents,
    LoggedEvent,
    committed_events_json,
    committed_in,
    created_event,
    failure_events,
)
from tests.events_oracle import validate_events, validate_response

SNAPSHOT = {"id": "resp_x", "object": "response", "created_at": 1, "status": "in_progress", "error": None,
            "model": "m", "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}


def test_every_event_type_is_one_the_sdk_knows():
    sdk_types = {get_args(member.model_fields["type"].annotation)[0] for member in get_args(get_args(
        ResponseStreamEvent)[0])}
    assert sdk_types >= EVENT_TYPES
    assert TERMINAL_EVENT_TYPES <= EVENT_TYPES


def test_a_failure_ends_the_stream_with_error_then_response_failed():
    events, failed = failure_events(7, SNAPSHOT, "It broke.", event_code="stream_interrupted")
    assert [(e.seq, e.type) for e in events] == [(7, "error"), (8, "response.failed")]
    error, terminal = validate_events([e.payload for e in events])
    assert (error.code, error.message) == ("stream_interrupted", "It broke.")
    assert terminal.response.status == "failed" and terminal.response.error.code == "server_error"
    assert orjson.loads(events[1].payload)["response"] == failed
    assert events[1].is_terminal and not events[0].is_terminal
    validate_response(failed)


def test_the_created_event_is_sequence_zero():
    event = created_event(SNAPSHOT)
    assert (event.seq, event.type) == (0, "response.created")
    assert validate_events([event.payload])[0].response.id == "resp_x"


# Any text a payload or a type could hold: control characters, line separators, every
# plane (lone surrogates cannot be stored, and neither writer takes them).
_text = st.text(st.characters(exclude_categories=("Cs",)))


@settings(max_examples=400)
@given(_text, st.lists(st.builds(LoggedEvent, seq=st.integers(0, 2**31 - 1), type=_text, payload=_text,
                                 hash=st.none() | st.binary(min_size=32, max_size=32))),
       st.none() | st.integers(0, 2**31 - 1))
def test_committed_events_written_without_their_model_are_the_models_bytes(response_id, events, through_seq):
    written = committed_events_json(response_id, events, through_seq)
    assert written == TypeAdapter(CommittedEvents).dump_json(CommittedEvents(
        response_id=response_id, events=events, through_seq=through_seq))


@settings(max_examples=200)
@given(st.lists(st.builds(CommittedEvents, response_id=_text, through_seq=st.none() | st.integers(0, 2**31 - 1),
                          events=st.lists(st.builds(LoggedEvent, seq=st.integers(0, 2**31 - 1), type=_text,
                                                    payload=_text)))))
def test_an_announcement_reads_as_its_model_validates_it(committed):
    announcement = AnnouncedEvents(committed=committed).model_dump_json().encode()
    assert committed_in(announcement) == AnnouncedEvents.model_validate_json(announcement).committed == committed


def test_an_announcement_of_another_version_is_refused():
    with pytest.raises(ValueError, match="version 2"):
        committed_in(b'{"v":2,"committed":[]}')
