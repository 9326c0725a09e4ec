"""The hash chain and the verification over every golden case (``tests/unit/parser``):
a log as the API and the parser store it verifies, and one altered in a payload, a
token batch, the order of its events or a hash fails, naming the event."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from steno.schemas.bus import TokenBatch
from steno.schemas.chain import GENESIS, chain_hashes, event_hash
from steno.schemas.events import created_event
from steno.schemas.responses import ParseContext
from steno.services.audit import StoredEvent, StoredResponse, Verification, check
from steno.services.audit.records import LinkTarget
from steno.services.parser import ResponseRecord, reparse
from steno.services.parser.response_state import ResponseState
from tests.parse_support import BASE, RID
from tests.unit.parser.test_golden_events import CASES, RECORDING, SPLITS, _messages

GOLDEN = sorted(f"{n}/{s}" for n in CASES for s in SPLITS)
AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
PREVIOUS = "resp_previous"
PREVIOUS_HASH = hashlib.sha256(b"the last event of resp_previous").digest()


def stored_log(name: str, link: bytes | None = None) -> StoredResponse:
    """The golden case as Postgres would hold it: event 0 stored by the API (chained to
    ``link``, else GENESIS), the parser's events with the hashes it gave them, and its
    record of the token stream."""
    case_name, split = name.split("/")
    case = CASES[case_name]
    base = {**BASE, **case.get("base", {})}
    context = ParseContext(prompt_tokens=10, **case.get("context", {}))
    first = created_event(base)
    first.hash = event_hash(link or GENESIS, first.payload)
    state = ResponseState(RID, base, context, clock=lambda: 0, chain_head=first.hash)
    events, recorded = [first], []
    for message in _messages(case, SPLITS[split]):
        applied = state.apply(message)
        if applied is not None:
            events += applied.events
            recorded += applied.recorded
    # As response_tokens keeps them: without what only the live stream carries.
    recorded = [m.model_copy(update={"resumed_after": None, "parser_seed": None}) if isinstance(m, TokenBatch) else m
                for m in recorded]
    final = state.final_snapshot
    assert final is not None
    return StoredResponse(
        response_id=RID, tenant_id="t", model="m", status=final["status"], store=True, created_at=AT,
        previous_response_id=PREVIOUS if link else None, conversation_id=None, base_snapshot=base, snapshot=final,
        chained_to_response_id=PREVIOUS if link else None, chained_to_seq=9 if link else None,
        chained_to_hash=link, events=[StoredEvent(e.seq, e.type, e.payload, e.hash, AT) for e in events],
        record=ResponseRecord(RID, final["status"], base, context.model_dump(), recorded, first.hash),
        link=LinkTarget(True, True, link, None) if link else None,
    )


def verified(stored: StoredResponse) -> Verification:
    return check(stored, reparse(stored.record))


def with_event(stored: StoredResponse, seq: int, **changes: Any) -> StoredResponse:
    events = [dataclasses.replace(e, **changes) if e.seq == seq else e for e in stored.events]
    return dataclasses.replace(stored, events=events)


def test_the_hash_is_sha256_of_the_previous_hash_and_the_payload_bytes():
    payload = '{"type":"response.output_text.delta","delta":"Déjà vu 日本"}'
    assert event_hash(GENESIS, payload) == hashlib.sha256(bytes(32) + payload.encode("utf-8")).digest()
    hashes = chain_hashes(GENESIS, ["a", "b"])
    assert hashes == [event_hash(GENESIS, "a"), event_hash(event_hash(GENESIS, "a"), "b")]


@pytest.mark.parametrize("name", GOLDEN)
def test_the_parsers_hashes_chain_the_golden_payloads(name):
    """The parser hashes the recorded payloads, in order, from the hash of event 0."""
    stored = stored_log(name)
    recording = json.loads(Path(RECORDING).read_text())[name]
    assert [e.payload for e in stored.events[1:]] == recording
    assert [e.hash for e in stored.events[1:]] == chain_hashes(stored.events[0].hash, recording)


@pytest.mark.parametrize("name", GOLDEN)
def test_an_untouched_golden_log_verifies(name):
    verification = verified(stored_log(name))
    assert verification.ok, verification.report()
    assert verification.hashed and verification.finished
    assert "byte-identical" in verification.summary()


@pytest.mark.parametrize("name", GOLDEN)
def test_a_log_chained_to_a_previous_response_verifies(name):
    verification = verified(stored_log(name, link=PREVIOUS_HASH))
    assert verification.ok, verification.report()
    assert verification.chained_to == (PREVIOUS, 9)


def test_re_parsing_chains_exactly_as_the_parser_stored():
    """The re-parse gives the stored hashes, not only the stored payloads: what a
    restore writes back is what the parser would have written."""
    stored = stored_log("reasoning_and_answer/random")
    assert [e.hash for e in reparse(stored.record).events] == [e.hash for e in stored.events[1:]]


@pytest.mark.parametrize("name", ["reasoning_and_answer/single", "preamble_then_call/random", "keepalive/whole"])
def test_an_altered_payload_fails_at_that_event(name):
    stored = stored_log(name)
    seq = len(stored.events) // 2
    payload = stored.events[seq].payload
    altered = payload.replace('"sequence_number"', '"sequence_number" ', 1) if '"delta":"' not in payload \
        else payload.replace('"delta":"', '"delta":"X', 1)
    verification = verified(with_event(stored, seq, payload=altered))
    assert not verification.ok
    assert verification.first is not None and verification.first.seq == seq
    assert f"FAILED at seq {seq}" in verification.summary()
    whats = [f.what for f in verification.findings if f.seq == seq]
    assert any("differs from the re-parse" in what for what in whats)
    assert any("is not sha256" in what for what in whats)


def test_an_altered_first_event_fails_at_seq_0():
    stored = stored_log("reasoning_and_answer/whole")
    altered = stored.events[0].payload.replace('"model":"m"', '"model":"n"')
    verification = verified(with_event(stored, 0, payload=altered))
    assert verification.first is not None and verification.first.seq == 0
    assert "response.created of the stored base snapshot" in verification.first.what


def test_an_altered_token_batch_fails_at_the_first_event_it_changes():
    stored = stored_log("reasoning_and_answer/single")
    consumed = list(stored.record.consumed)
    # A token of the reasoning text: one output token replaced by another.
    victim = next(i for i, m in enumerate(consumed) if isinstance(m, TokenBatch) and i > 6)
    batch = consumed[victim]
    assert isinstance(batch, TokenBatch)
    consumed[victim] = batch.model_copy(update={"token_ids": [batch.token_ids[0] + 1]})
    tampered = dataclasses.replace(stored, record=dataclasses.replace(stored.record, consumed=consumed))
    verification = verified(tampered)
    assert not verification.ok
    first = verification.first
    assert first is not None and first.seq is not None and first.seq > 1
    assert "re-parse" in first.what


def test_swapped_events_fail_at_the_first_of_them():
    stored = stored_log("reasoning_and_answer/single")
    a, b = stored.events[4], stored.events[5]
    events = [*stored.events[:4], dataclasses.replace(b, seq=4), dataclasses.replace(a, seq=5), *stored.events[6:]]
    verification = verified(dataclasses.replace(stored, events=events))
    assert verification.first is not None and verification.first.seq == 4
    assert "sequence_number" in verification.first.what or "re-parse" in verification.first.what


def test_an_altered_hash_fails_at_that_event():
    stored = stored_log("preamble_then_call/whole")
    seq = 3
    verification = verified(with_event(stored, seq, hash=hashlib.sha256(b"forged").digest()))
    assert verification.first is not None and verification.first.seq == seq
    assert "is not sha256" in verification.first.what
    # The next event no longer chains to it either; nothing before it is blamed.
    assert {f.seq for f in verification.findings} == {seq, seq + 1}


def test_a_missing_event_fails_at_its_seq():
    stored = stored_log("reasoning_and_answer/whole")
    events = [e for e in stored.events if e.seq != 6]
    verification = verified(dataclasses.replace(stored, events=events))
    assert verification.first is not None and verification.first.seq == 6
    assert "missing from the log" in verification.first.what


def test_a_broken_link_to_the_previous_response_fails_at_seq_0():
    stored = stored_log("reasoning_and_answer/whole", link=PREVIOUS_HASH)
    moved = dataclasses.replace(stored, link=LinkTarget(True, True, hashlib.sha256(b"rewritten").digest(), None))
    verification = verified(moved)
    assert verification.first is not None and verification.first.seq == 0
    assert "chained to resp_previous seq 9" in verification.first.what


def test_a_link_to_a_response_since_deleted_is_noted_not_failed():
    stored = stored_log("reasoning_and_answer/whole", link=PREVIOUS_HASH)
    verification = verified(dataclasses.replace(stored, link=LinkTarget(False, False, None, None)))
    assert verification.ok
    assert any("no longer stored" in note for note in verification.notes)


def test_a_snapshot_that_is_not_the_fold_of_the_log_fails():
    stored = stored_log("reasoning_and_answer/whole")
    assert stored.snapshot is not None
    changed = {**stored.snapshot, "output": stored.snapshot["output"][:1]}
    verification = verified(dataclasses.replace(stored, snapshot=changed))
    assert verification.first is not None and verification.first.seq is None
    assert "not the fold" in verification.first.what and ".output" in verification.first.what


def test_a_log_stored_before_the_chain_verifies_without_it():
    stored = stored_log("reasoning_and_answer/whole")
    unhashed = dataclasses.replace(stored, events=[dataclasses.replace(e, hash=None) for e in stored.events],
                                   record=dataclasses.replace(stored.record, chain_head=None))
    verification = verified(unhashed)
    assert verification.ok and not verification.hashed
    assert "predate hashing" in verification.summary()


def test_one_unhashed_event_amid_a_chain_fails():
    stored = stored_log("reasoning_and_answer/whole")
    verification = verified(with_event(stored, 2, hash=None))
    assert verification.first is not None and verification.first.seq == 2
    assert "no hash" in verification.first.what


def test_a_re_parse_that_cannot_go_on_names_where_it_stopped():
    stored = stored_log("reasoning_and_answer/single")
    consumed = list(stored.record.consumed)
    batch = consumed[5]
    assert isinstance(batch, TokenBatch)
    # A batch stored under a number that skips ahead: the stream's order rule refuses it.
    consumed[5] = batch.model_copy(update={"batch_no": batch.batch_no + 7})
    verification = verified(dataclasses.replace(stored, record=dataclasses.replace(stored.record, consumed=consumed)))
    assert not verification.ok
    assert any(f.seq is None and f"stopped at batch {batch.batch_no + 7} of attempt 0" in f.what
               for f in verification.findings)
    first = verification.first
    assert first is not None and first.seq is not None and "not reproduced" in first.what
