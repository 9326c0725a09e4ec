"""What ``truncation: "auto"`` costs the API: a long conversation rendered whole, then
fitted to a context by leaving out its oldest turns (bisection, as the API does it, each
render reusing the messages rendered before).

    python -m steno.benchmarks.truncation [--turns 200] [--context 4096] [--rounds 5]

Prints the whole prompt's size and render time, and the fitting's renders and time
(best of ``rounds``, each round in a fresh renderer so nothing is reused between rounds)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from steno.schemas.api import CreateResponseRequest
from steno.services.api.truncation import Conversation, TurnSearch, without_oldest_turns
from steno.services.dialects.harmony import HarmonyDialect
from steno.services.dialects.harmony.vocabulary import harmony_encoding


def conversation(turns: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for turn in range(turns):
        items += [{"role": "user", "content": f"Question {turn}: " + "tell me more " * 40},
                  {"role": "assistant", "content": f"Answer {turn}: " + "here is more " * 40}]
    return [*items, {"role": "user", "content": "And the last question?"}]


def fit_once(turns: int, context: int) -> tuple[int, float, int, float, int]:
    """(whole prompt tokens, its render ms, fitting renders, fitting ms, turns left out)."""
    dialect = HarmonyDialect(harmony_encoding())
    said = conversation(turns)
    request = CreateResponseRequest(model="m", input=said, truncation="auto")
    started = time.perf_counter()
    whole = dialect.render(request, 0, reuse_scope="bench")
    rendered = time.perf_counter()
    items = Conversation([], said)
    search, renders = TurnSearch(items), 0
    while (tried := search.next_try()) is not None:
        kept, _ = without_oldest_turns(items, tried)
        prompt = dialect.render(request.model_copy(update={"input": kept.input}), 0, reuse_scope="bench")
        renders += 1
        search.tried(tried, len(prompt.token_ids) < context)
    fitted = time.perf_counter()
    return len(whole.token_ids), (rendered - started) * 1000, renders, (fitted - rendered) * 1000, search.fewest or 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results = [fit_once(args.turns, args.context) for _ in range(args.rounds)]
    tokens, _, renders, _, left_out = results[0]
    print(f"{args.turns} turns, {tokens} prompt tokens: whole render {min(r[1] for r in results):.1f} ms; "
          f"fitted to {args.context} in {renders} renders, {min(r[3] for r in results):.1f} ms, "
          f"{left_out} turns left out")


if __name__ == "__main__":
    main()
