"""The parser's events for a fixed set of token streams, byte for byte, against a
recording (``golden_events.json``).

A stored log must re-parse to the same bytes for as long as it is kept (``steno audit``
proves a log by re-parsing its stored tokens), so a change to the parser that changes
any byte of any event is a change of the log format, never a refactoring. When such a
change is meant, re-record with ``python -m tests.unit.parser.test_golden_events`` and
say why in the commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from steno.schemas.bus import GenerationEnded, TokenBatch, TokenStreamMessage
from steno.schemas.responses import ParseContext
from steno.services.parser.response_state import ResponseState
from tests.harmony_samples import assistant, completion, encoding
from tests.parse_support import BASE, RID, batches, random_sizes

RECORDING = Path(__file__).with_name("golden_events.json")


def _tokens(case: dict[str, Any]) -> list[int]:
    tokens = completion([assistant(*message) for message in case["messages"]], end=case.get("end", "<|return|>"))
    if "extra" in case:
        tokens += encoding().encode(case["extra"], allowed_special="all")
    return tokens[: case["cut"]] if "cut" in case else tokens


CASES: dict[str, dict[str, Any]] = {
    "reasoning_and_answer": {"messages": [("analysis", "Déjà vu, 日本 🎉"), ("final", "Hello, world!")]},
    "preamble_then_call": {
        "messages": [("commentary", "Let me look."),
                     ("commentary", '{"city":"Paris"}', "functions.get_weather", "json")],
        "end": "<|call|>", "context": {"function_tools": ["get_weather"]},
    },
    "namespaced_call": {
        "messages": [("commentary", '{"email":"a@b.c"}', "functions.crm.find_user", "json")], "end": "<|call|>",
        "context": {"function_tools": ["crm.find_user"], "namespaces": ["crm"]},
    },
    "custom_tool": {
        "messages": [("commentary", '{"input": "*** Begin Patch\\n+ é\\n"}', "functions.apply_patch", "json")],
        "end": "<|call|>", "context": {"function_tools": ["apply_patch"], "custom_tools": ["apply_patch"]},
    },
    "browser": {
        "messages": [("analysis", "Search first."), ("analysis", '{"query": "steno"}', "browser.search"),
                     ("analysis", '{"id": 3, "cursor": 2}', "browser.open"),
                     ("analysis", '{"pattern": "NATS", "cursor": 4}', "browser.find")],
        "end": "<|call|>",
    },
    "python": {"messages": [("analysis", "print(1 + 1)", "python")], "end": "<|call|>"},
    "mcp_and_builtin": {
        "messages": [("commentary", '{"path": "/"}', "mcp.list_files"),
                     ("analysis", '{"cmd": ["ls"]}', "container.exec")],
        "end": "<|call|>",
    },
    "constrained_final": {"messages": [("final", '{"a": 1}', None, "<|constrain|>json")]},
    "unknown_channel": {"messages": [("musings", "hmm"), ("final", "ok")]},
    "length": {"messages": [("analysis", "A rather long line of reasoning here")], "cut": 9, "finish": "length"},
    "cancelled": {"messages": [("final", "Stopped half way through")], "cut": 7, "finish": "cancelled"},
    "engine_error": {"messages": [("final", "partial")], "cut": 5, "finish": "error",
                     "error": "vLLM failed the request: ValueError: bad"},
    "malformed": {"messages": [("final", "ok")], "extra": "<|message|><|message|>"},
    "logprobs": {"messages": [("analysis", "hm"), ("final", "Yes, 日本.")], "logprobs": True,
                 "context": {"include_logprobs": True}},
    "keepalive": {"messages": [("final", "after a pause")], "keepalive_after": 1},
    "taken_over": {"messages": [("analysis", "Two workers."), ("final", "One answer.")], "takeover_after": 2},
    "diverged": {"messages": [("final", "Never finished.")], "takeover_after": 1, "resumed_after": 5},
    # Log format 2: every output_text part carries logprobs; a Response created with
    # completed_at reports it at its end.
    "format_2_answer": {"messages": [("analysis", "hm"), ("final", "Plain.")], "context": {"v": 2},
                        "base": {"completed_at": None}},
    "format_2_logprobs": {"messages": [("final", "Yes.")], "logprobs": True,
                          "context": {"v": 2, "include_logprobs": True}, "base": {"completed_at": None}},
    "format_2_failure": {"messages": [("final", "partial")], "cut": 5, "finish": "error",
                         "error": "vLLM failed the request: ValueError: bad", "context": {"v": 2},
                         "base": {"completed_at": None}},
}
SPLITS = {"whole": [10_000], "single": [1] * 400, "random": random_sizes(7, 400)}


def _messages(case: dict[str, Any], sizes: list[int]) -> list[TokenStreamMessage]:
    """The token stream a worker (or two, for a takeover) would publish."""
    tokens = _tokens(case)
    sent = batches(tokens, sizes)
    if case.get("logprobs"):
        for batch in sent:
            batch.logprobs = [-0.25 * (i + 1) for i in range(len(batch.token_ids))]
            batch.top_logprobs = [[(t, -0.25), (t + 1, -2.0)] for t in batch.token_ids]
    if "keepalive_after" in case:
        at = case["keepalive_after"]
        sent = [*sent[:at], TokenBatch(response_id=RID, attempt=0, batch_no=at, token_ids=[]),
                *[b.model_copy(update={"batch_no": b.batch_no + 1}) for b in sent[at:]]]
    attempt = 0
    if "takeover_after" in case and len(sent) > case["takeover_after"]:
        at = case["takeover_after"]
        published = sum(len(b.token_ids) for b in sent[:at])
        later = [b.model_copy(update={"attempt": 1, "batch_no": n}) for n, b in enumerate(sent[at:])]
        later[0].resumed_after = case.get("resumed_after", published)
        sent, attempt = [*sent[:at], *later], 1
    batch_count = sum(1 for b in sent if b.attempt == attempt)
    return [*sent, GenerationEnded(response_id=RID, attempt=attempt, batch_count=batch_count,
                                   finish_reason=case.get("finish", "stop"), prompt_tokens=10,
                                   output_tokens=len(tokens), cached_tokens=3,
                                   error_code="server_error" if "error" in case else None,
                                   error_message=case.get("error"), completed_at=1_700_000_123)]


def _parse(case: dict[str, Any], messages: list[TokenStreamMessage]) -> tuple[list[str], list[TokenStreamMessage]]:
    """The events' payloads, and what the parser records of the token stream."""
    base = {**BASE, **case.get("base", {})}
    state = ResponseState(RID, base, ParseContext(prompt_tokens=10, **case.get("context", {})), clock=lambda: 0)
    payloads: list[str] = []
    recorded: list[TokenStreamMessage] = []
    for message in messages:
        applied = state.apply(message)
        if applied is not None:
            payloads += [event.payload for event in applied.events]
            recorded += applied.recorded
    return payloads, recorded


def record(case: dict[str, Any], sizes: list[int]) -> list[str]:
    return _parse(case, _messages(case, sizes))[0]


def recording() -> dict[str, list[str]]:
    return {f"{name}/{split}": record(case, sizes) for name, case in CASES.items() for split, sizes in SPLITS.items()}


@pytest.mark.parametrize("name", sorted(f"{n}/{s}" for n in CASES for s in SPLITS))
def test_events_are_byte_identical_to_the_recording(name):
    recorded = json.loads(RECORDING.read_text())
    case, split = name.split("/")
    assert record(CASES[case], SPLITS[split]) == recorded[name]


@pytest.mark.parametrize("name", sorted(f"{n}/{s}" for n in CASES for s in SPLITS))
def test_re_parsing_what_the_parser_recorded_gives_the_same_events(name):
    """What ``steno audit`` does: the record (as response_tokens keeps it, which is
    without ``resumed_after`` or the parser seed) must re-parse to the same events."""
    case, split = name.split("/")
    payloads, recorded = _parse(CASES[case], _messages(CASES[case], SPLITS[split]))
    as_stored = [m.model_copy(update={"resumed_after": None, "parser_seed": None}) if isinstance(m, TokenBatch) else m
                 for m in recorded]
    assert _parse(CASES[case], as_stored)[0] == payloads


def test_the_recording_covers_every_case():
    assert set(json.loads(RECORDING.read_text())) == set(recording())


if __name__ == "__main__":
    RECORDING.write_text(json.dumps(recording(), indent=1, ensure_ascii=False) + "\n")
    print(f"recorded {RECORDING}", file=sys.stderr)
