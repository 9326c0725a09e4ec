"""Verifying a stored response: its log is what its stored tokens say, its snapshot is
what its log says, and its hashes chain, within it and to the response it continues.

The checks (``check``, pure):
- every event's payload is JSON whose ``type`` and ``sequence_number`` are its row's;
- event 0 is ``response.created`` of the stored base snapshot, byte for byte;
- events 1 on are the re-parse of the stored token batches, byte for byte (the parser's
  events are a pure function of the request context and the batches);
- each hash is ``sha256(previous hash || payload)`` (``schemas/chain.py``), event 0's
  previous being the hash the response records for its link (or GENESIS);
- the link: the recorded hash is the stored hash of the event it names, in the response
  it continues (its ``previous_response_id``, or a response of its conversation);
- a finished response's stored snapshot is the fold of its events, and its log ends
  with the terminal event.
A finding names the event (response, seq, type) and what differs; the report leads with
the first (lowest seq; findings about the response as a whole come last)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import orjson

from steno.schemas.bus import TokenBatch
from steno.schemas.chain import GENESIS, event_hash
from steno.schemas.events import TERMINAL_EVENT_TYPES, created_event
from steno.schemas.fold import fold
from steno.schemas.responses import ParseContext
from steno.services.audit.records import AuditRecords, StoredEvent, StoredResponse
from steno.services.common.reasoning_keys import ReasoningKeys
from steno.services.parser import EventLog, Reparse, ResponseWrite, reparse

# Puts a chat-template model's files (by digest) into the local model files directory.
ModelFiles = Callable[[str], Awaitable[None]]

# Records a finding: (seq, event type, what differs).
Report = Callable[[int | None, str | None, str], None]

TERMINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})
SHOWN_FINDINGS = 20


@dataclass(frozen=True)
class Finding:
    response_id: str
    # None: about the response as a whole (its snapshot, its re-parse).
    seq: int | None
    event_type: str | None
    what: str

    def describe(self) -> str:
        if self.seq is None:
            return self.what
        kind = f" ({self.event_type})" if self.event_type else ""
        return f"seq {self.seq}{kind}: {self.what}"


@dataclass(frozen=True)
class Verification:
    response_id: str
    events: int
    findings: list[Finding]
    # Whether its events carry hashes (those stored before migration 0009 do not).
    hashed: bool
    # The event its first event chained to: (response id, seq).
    chained_to: tuple[str, int] | None
    finished: bool
    notes: list[str] = field(default_factory=list)
    restored: int = 0

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def first(self) -> Finding | None:
        """The first bad event (findings about the response as a whole after any event's)."""
        ordered = sorted(self.findings, key=lambda f: (f.seq is None, f.seq or 0))
        return ordered[0] if ordered else None

    def summary(self) -> str:
        """One line: what was proved, or where the log first goes wrong."""
        if not self.ok:
            first = self.first
            assert first is not None
            where = f"at seq {first.seq}" + (f" ({first.event_type})" if first.event_type else "") \
                if first.seq is not None else "as a whole"
            more = len(self.findings) - 1
            return (f"{self.response_id}: FAILED {where}: {first.what}"
                    + (f" (and {more} more finding{'s' * (more != 1)})" if more else ""))
        parts = [f"{self.events} events", "re-parse of the stored tokens byte-identical"]
        parts.append("fold = stored snapshot" if self.finished else "still running")
        if self.hashed:
            link = f"chained to {self.chained_to[0]} seq {self.chained_to[1]}" if self.chained_to \
                else "chain starts here"
            parts.append(f"hash chain unbroken ({link})")
        else:
            parts.append("its events predate hashing (nothing to chain)")
        restored = f"; {self.restored} missing events restored" if self.restored else ""
        return f"{self.response_id}: intact: " + ", ".join(parts) + restored

    def report(self) -> str:
        """The summary, then the other findings (the first ``SHOWN_FINDINGS``) and the notes."""
        lines = [self.summary()]
        ordered = sorted(self.findings, key=lambda f: (f.seq is None, f.seq or 0))
        # The first is the summary's.
        lines += [f"  {finding.describe()}" for finding in ordered[1:SHOWN_FINDINGS + 1]]
        if len(ordered) > SHOWN_FINDINGS + 1:
            lines.append(f"  ... {len(ordered) - SHOWN_FINDINGS - 1} more")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def check(response: StoredResponse, reparsed: Reparse) -> Verification:
    """Every check above, over one response as read in one snapshot of the database."""
    rid = response.response_id
    findings: list[Finding] = []
    notes: list[str] = []

    def bad(seq: int | None, event_type: str | None, what: str) -> None:
        findings.append(Finding(rid, seq, event_type, what))

    events = response.events
    stored = {event.seq: event for event in events}
    bodies = _framing(events, bad)
    _first_event(response, stored.get(0), bad)
    _reparse_agrees(response, stored, reparsed, bad, notes)
    hashed = any(event.hash is not None for event in events)
    if hashed:
        _chain(response, stored, bad)
    elif response.chained_to_hash is not None:
        bad(0, events[0].type if events else None,
            "no hash, though the response records the hash its first event chains to")
    else:
        notes.append("its events were stored before migration 0009 (event hashes): the chain is not checked")
    _link(response, stored.get(0), hashed, bad, notes)
    finished = response.status in TERMINAL_STATUSES
    if finished:
        _snapshot(response, bodies, bad)
    chained_to = None
    if response.chained_to_response_id is not None and response.chained_to_seq is not None:
        chained_to = (response.chained_to_response_id, response.chained_to_seq)
    return Verification(rid, len(events), findings, hashed, chained_to, finished, notes)


def _framing(events: list[StoredEvent], bad: Report) -> list[Any] | None:
    """Each payload parsed (None when one is not JSON)."""
    bodies: list[Any] | None = []
    for event in events:
        try:
            body = orjson.loads(event.payload)
        except orjson.JSONDecodeError:
            bad(event.seq, event.type, "the payload is not JSON")
            bodies = None
            continue
        if bodies is not None:
            bodies.append(body)
        if not isinstance(body, dict):
            bad(event.seq, event.type, "the payload is not a JSON object")
        elif body.get("sequence_number") != event.seq:
            bad(event.seq, event.type, f"the payload's sequence_number is {body.get('sequence_number')!r}, "
                                       f"stored at seq {event.seq}")
        elif body.get("type") != event.type:
            bad(event.seq, event.type, f"the payload's type is {body.get('type')!r}, the row's {event.type!r}")
    return bodies


def _first_event(response: StoredResponse, first: StoredEvent | None,
                 bad: Report) -> None:
    expected = created_event(response.base_snapshot)
    if first is None:
        bad(0, "response.created", "missing from the log")
    elif first.payload != expected.payload:
        bad(0, first.type, "the payload differs from response.created of the stored base snapshot "
                           f"({difference(first.payload, expected.payload, 'stored', 'the base snapshot')})")


def _reparse_agrees(response: StoredResponse, stored: dict[int, StoredEvent], reparsed: Reparse,
                    bad: Report, notes: list[str]) -> None:
    written_by_api = [stored[seq].type for seq in sorted(stored) if seq > 0]
    if not response.record.consumed and written_by_api == ["error", "response.failed"]:
        # The API ends a response whose work it could not queue: no tokens, two events.
        notes.append("seq 1-2 were written by the API (its work could not be queued): nothing to re-parse")
        return
    produced = {event.seq: event for event in reparsed.events}
    stopped = ""
    if reparsed.error is not None:
        at = reparsed.stopped_at
        where = "" if at is None else f" at batch {at.batch_no} of attempt {at.attempt}" \
            if isinstance(at, TokenBatch) else f" at the end of attempt {at.attempt}"
        stopped = f"re-parsing the stored tokens stopped{where}: {reparsed.error}"
        bad(None, None, stopped)
    for seq in sorted(set(produced) | (set(stored) - {0})):
        mine, theirs = produced.get(seq), stored.get(seq)
        if theirs is None:
            assert mine is not None
            bad(seq, mine.type, f"missing from the log (re-parsing the stored tokens gives {mine.type})")
        elif mine is None:
            bad(seq, theirs.type, f"not reproduced: {stopped}" if stopped
                else "not produced by re-parsing the stored tokens")
        elif mine.payload != theirs.payload:
            bad(seq, theirs.type, "the payload differs from the re-parse of the stored tokens "
                                  f"({difference(theirs.payload, mine.payload, 'stored', 're-parse')})")
        elif mine.type != theirs.type:
            bad(seq, theirs.type, f"stored as {theirs.type!r}; the re-parse gives {mine.type!r}")


def _chain(response: StoredResponse, stored: dict[int, StoredEvent],
           bad: Report) -> None:
    """Each event against its stored predecessor, so a changed payload shows at its own
    event and a changed hash at its own and the next."""
    for seq in sorted(stored):
        event = stored[seq]
        if seq == 0:
            previous: bytes | None = response.chained_to_hash or GENESIS
        elif (before := stored.get(seq - 1)) is None:
            bad(seq, event.type, f"the event before it (seq {seq - 1}) is missing from the log")
            continue
        else:
            previous = before.hash
        if event.hash is None:
            bad(seq, event.type, "no hash, though the response's other events have one")
        elif previous is not None and event.hash != event_hash(previous, event.payload):
            source = "the hash the response records for its link" if seq == 0 and response.chained_to_hash \
                else "GENESIS" if seq == 0 else f"seq {seq - 1}'s hash"
            bad(seq, event.type, f"the hash {event.hash.hex()[:16]}… is not sha256({source} || payload)")


def _link(response: StoredResponse, first: StoredEvent | None, hashed: bool,
          bad: Report, notes: list[str]) -> None:
    first_type = first.type if first is not None else None
    target_id = response.chained_to_response_id
    if target_id is None:
        if hashed and response.previous_response_id is not None:
            bad(0, first_type, f"made with previous_response_id {response.previous_response_id} but chained to "
                               "nothing")
        return
    target = f"{target_id} seq {response.chained_to_seq}"
    link = response.link
    if link is None or not link.response_stored:
        notes.append(f"chained to {target}, which is no longer stored: the link itself is not checked")
    elif not link.event_stored:
        bad(0, first_type, f"chained to {target}, which is missing from that response's log")
    elif link.hash != response.chained_to_hash:
        stored_hash = link.hash.hex()[:16] + "…" if link.hash is not None else "none"
        recorded = response.chained_to_hash.hex()[:16] + "…" if response.chained_to_hash is not None else "none"
        bad(0, first_type, f"chained to {target}, whose stored hash ({stored_hash}) is not the one recorded "
                           f"({recorded})")
    if response.previous_response_id is not None:
        if target_id != response.previous_response_id:
            bad(0, first_type, f"chained to {target_id}, not to its previous response {response.previous_response_id}")
    elif response.conversation_id is None:
        bad(0, first_type, f"chained to {target_id}, though it continues no response")
    elif link is not None and link.response_stored and link.conversation_id != response.conversation_id:
        bad(0, first_type, f"chained to {target_id}, which is not a response of its conversation "
                           f"{response.conversation_id}")


def _snapshot(response: StoredResponse, bodies: list[Any] | None,
              bad: Report) -> None:
    if response.snapshot is None:
        bad(None, None, f"the response is {response.status} but has no final snapshot")
        return
    if response.snapshot.get("status") != response.status:
        bad(None, None, f"its status is {response.status!r}, its snapshot's {response.snapshot.get('status')!r}")
    if response.events and response.events[-1].type not in TERMINAL_EVENT_TYPES:
        last = response.events[-1]
        bad(last.seq, last.type, "the log of a finished response ends here, without its terminal event")
    if bodies is None:
        return
    reached: list[Any] = []

    def tracked() -> Iterator[Any]:
        for body in bodies:
            reached.append(body)
            yield body

    try:
        folded = fold(tracked())
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        # Events that do not fit together (one moved before the item it belongs to, say).
        event = response.events[len(reached) - 1] if reached else None
        bad(event.seq if event else None, event.type if event else None,
            f"the stored events do not fold into a response here ({type(exc).__name__}: {exc})")
        return
    if folded != response.snapshot:
        bad(None, None, "the stored snapshot is not the fold of the stored events "
                        f"({difference(response.snapshot, folded, 'snapshot', 'fold')})")


def difference(mine: Any, theirs: Any, mine_label: str, theirs_label: str) -> str:
    """Where two JSON values (or JSON texts) first differ, briefly."""
    if isinstance(mine, str) and isinstance(theirs, str):
        try:
            mine, theirs = orjson.loads(mine), orjson.loads(theirs)
        except orjson.JSONDecodeError:
            return f"{mine_label} {_brief(mine)}, {theirs_label} {_brief(theirs)}"
        if mine == theirs:
            return "the same JSON in other bytes"
    path, a, b = _first_difference(mine, theirs, "")
    return f"at {path or 'the top'}: {mine_label} {_brief(a)}, {theirs_label} {_brief(b)}"


_ABSENT = object()


def _first_difference(a: Any, b: Any, path: str) -> tuple[str, Any, Any]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            x, y = a.get(key, _ABSENT), b.get(key, _ABSENT)
            if x != y or type(x) is not type(y):
                return _first_difference(x, y, f"{path}.{key}")
    if isinstance(a, list) and isinstance(b, list):
        for index in range(max(len(a), len(b))):
            x = a[index] if index < len(a) else _ABSENT
            y = b[index] if index < len(b) else _ABSENT
            if x != y or type(x) is not type(y):
                return _first_difference(x, y, f"{path}[{index}]")
    return path, a, b


def _brief(value: Any, limit: int = 60) -> str:
    if value is _ABSENT:
        return "(absent)"
    shown = orjson.dumps(value).decode()
    return shown if len(shown) <= limit else shown[:limit] + "…"


async def verify_response(pool: asyncpg.Pool, response_id: str, *, tenant_id: str | None = None,
                          restore: bool = False, model_files: ModelFiles | None = None) -> Verification | None:
    """Verifies one response (None when there is no such response, for this tenant).
    ``restore`` first writes back the events its re-parse has and its log lacks (never
    overwriting one), then verifies what is stored."""
    records = AuditRecords(pool)
    stored = await records.response(response_id, tenant_id)
    if stored is None:
        return None
    reparsed = await reparse_stored(pool, stored, model_files)
    restored = 0
    if restore:
        have = {event.seq for event in stored.events}
        missing = [event for event in reparsed.events if event.seq not in have]
        if missing:
            await EventLog(pool).commit([ResponseWrite(response_id, events=missing)])
            restored = len(missing)
            stored = await records.response(response_id, tenant_id)
            assert stored is not None
    verification = check(stored, reparsed)
    return dataclasses.replace(verification, restored=restored)


async def reparse_stored(pool: asyncpg.Pool, stored: StoredResponse, model_files: ModelFiles | None) -> Reparse:
    """The parser run again over the response's stored batches, with its model's files
    and the keys that sealed its reasoning."""
    context = ParseContext.model_validate(stored.parse_context)
    if context.dialect_files is not None and model_files is not None:
        try:
            await model_files(context.dialect_files)
        except Exception as exc:
            return Reparse([], None, None, f"the model files {context.dialect_files} could not be fetched: {exc}")
    sealing = context.reasoning_sealing
    seal = await ReasoningKeys(pool).holding(sealing.key_id) if sealing is not None else None
    # In a thread: the audit pages run in the API's process, whose streams must not wait
    # on a long response's re-parse (the thread yields the interpreter every few ms).
    return await asyncio.to_thread(reparse, stored.record, seal)


async def verify_responses(pool: asyncpg.Pool, response_ids: list[str], *, tenant_id: str | None = None,
                           model_files: ModelFiles | None = None) -> list[Verification]:
    """Each response in turn (one gone meanwhile is left out)."""
    verified = []
    for response_id in response_ids:
        verification = await verify_response(pool, response_id, tenant_id=tenant_id, model_files=model_files)
        if verification is not None:
            verified.append(verification)
    return verified


def summary_of(verifications: list[Verification], what: str) -> str:
    """One line for many responses."""
    failed = [v for v in verifications if not v.ok]
    events = sum(v.events for v in verifications)
    if not failed:
        unhashed = sum(not v.hashed for v in verifications)
        older = f" ({unhashed} stored before event hashes)" if unhashed else ""
        return f"{what}: {len(verifications)} responses, {events} events: all intact{older}"
    return f"{what}: {len(failed)} of {len(verifications)} responses FAILED"
