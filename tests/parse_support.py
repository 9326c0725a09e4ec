"""Runs the pure parser over token batches, as the parser service does."""

from __future__ import annotations

import random

from steno.schemas.bus import GenerationEnded, TokenBatch
from steno.schemas.responses import ParseContext
from steno.services.parser.response_state import ResponseState

RID = "resp_test"
BASE = {
    "id": RID,
    "object": "response",
    "created_at": 1700000000,
    "status": "in_progress",
    "model": "m",
    "output": [],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
}


def batches(tokens: list[int], sizes: list[int], attempt: int = 0) -> list[TokenBatch]:
    out, start, batch_no = [], 0, 0
    for size in sizes:
        if start >= len(tokens):
            break
        out.append(TokenBatch(response_id=RID, attempt=attempt, batch_no=batch_no,
                              token_ids=tokens[start:start + size]))
        start += size
        batch_no += 1
    if start < len(tokens):
        out.append(TokenBatch(response_id=RID, attempt=attempt, batch_no=batch_no, token_ids=tokens[start:]))
    return out


def random_sizes(seed: int, count: int, largest: int = 7) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, largest) for _ in range(count)]


def run(tokens, sizes, finish="stop", context=ParseContext(), logprobs=False, seal=None):
    state = ResponseState(RID, BASE, context, seal=seal)
    events = []
    sent = batches(tokens, sizes)
    for batch in sent:
        if logprobs:
            batch.logprobs = [-0.5] * len(batch.token_ids)
            batch.top_logprobs = [[(t, -0.5)] for t in batch.token_ids]
        events += state.apply_batch(batch).events
    ended = GenerationEnded(
        response_id=RID, attempt=0, batch_count=len(sent), finish_reason=finish,
        prompt_tokens=10, output_tokens=len(tokens),
    )
    events += state.apply_end(ended).events
    return state, events
