"""Replays, transcripts and pages from stored rows (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson

from steno.schemas.events import LoggedEvent
from steno.services.audit import StoredEvent, Transcript, Turn, render, replay
from steno.services.audit.pages import _items, _timeline
from steno.services.audit.transcript import describe
from steno.services.edge import frame

AT = datetime(2026, 12, 1, 12, 30, 1, 250_000, tzinfo=UTC)
TRICKY = 'déjà <script>alert("x")</script> & \u2028 next'


def event(seq: int, type_: str, **body) -> StoredEvent:
    payload = orjson.dumps({"type": type_, "sequence_number": seq, **body}).decode()
    return StoredEvent(seq, type_, payload, bytes([seq]) * 32, AT)


EVENTS = [event(0, "response.created", response={"id": "resp_x", "status": "queued"}),
          event(1, "response.output_text.delta", item_id="msg_1", output_index=0, content_index=0, delta=TRICKY)]


def test_the_sse_replay_is_the_edges_frames_each_after_its_stored_time():
    sse = replay(EVENTS, "sse")
    frames = b"".join(frame(LoggedEvent(seq=e.seq, type=e.type, payload=e.payload)) for e in EVENTS)
    assert b"".join(line for line in sse.splitlines(keepends=True) if not line.startswith(b":")) == frames
    assert sse.startswith(b": stored 2026-12-01T12:30:01.250000Z\nevent: response.created\nid: 0\ndata: ")


def test_a_jsonl_replay_is_one_line_per_event_with_the_payload_as_sent():
    lines = replay(EVENTS, "jsonl").decode().split("\n")
    assert lines[-1] == "" and len(lines) == 3
    records = [orjson.loads(line) for line in lines[:-1]]
    assert [r["seq"] for r in records] == [0, 1]
    assert records[1]["event"] == orjson.loads(EVENTS[1].payload)
    assert records[1]["hash"] == (bytes([1]) * 32).hex() and records[1]["stored_at"] == "2026-12-01T12:30:01.250000Z"
    # A line separator inside a payload stays escaped: a line is an event for any reader.
    assert len(replay(EVENTS, "jsonl").decode().splitlines()) == 2


def test_items_are_described_for_readers():
    assert describe({"type": "message", "role": "user", "content": "hi"}).title == "user"
    assert describe({"role": "assistant", "content": [{"type": "output_text", "text": "a"},
                                                      {"type": "input_image"}]}).text == "a\n[input_image]"
    call = describe({"type": "function_call", "namespace": "crm", "name": "find", "call_id": "c1",
                     "arguments": "{}"})
    assert (call.kind, call.title, call.text) == ("call", "tool call crm.find (c1)", "{}")
    output = describe({"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text"}]})
    assert (output.kind, output.title) == ("output", "function call output (c1)")
    sealed = describe({"type": "reasoning", "summary": [], "encrypted_content": "blob"})
    assert sealed.text == "(sealed: encrypted_content)"
    assert describe({"type": "shell_call", "call_id": "c2", "action": {"commands": ["ls"]}}).title == "shell call (c2)"


def test_a_markdown_transcript_cannot_be_broken_out_of():
    turn = Turn("resp_1", [{"type": "message", "role": "user", "content": "```\n# not a heading"}],
                [{"type": "function_call", "name": "run", "call_id": "c", "arguments": "````x````"}],
                "m", "completed", AT, "Be brief.")
    text = render(Transcript("resp_1", "response_chain", [turn]), "markdown")
    assert "> ```\n> # not a heading" in text
    assert "`````\n````x````\n`````" in text
    assert "**instructions**\n\n> Be brief." in text
    as_json = orjson.loads(render(Transcript("resp_1", "response_chain", [turn]), "json"))
    assert as_json["turns"][0]["input"] == turn.input
    assert as_json["turns"][0]["created_at"] == "2026-12-01T12:30:01.250000Z"


def test_pages_escape_everything_they_show():
    row = _timeline(EVENTS, {1})
    assert "<script>" not in row and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in row
    assert 'id="seq-1" class="bad"' in row
    items = _items([{"type": "message", "role": "<b>user</b>", "content": TRICKY}])
    assert "<b>" not in items and "&lt;b&gt;user&lt;/b&gt;" in items and "<script>" not in items
