"""What rendering a prompt costs the API, by dialect: a conversation of ``turns`` turns
rendered with nothing reused, then the same conversation one turn longer, as its next
request renders it (what the turns before left reused).

    python -m steno.benchmarks.rendering [--turns 20] [--words 60] [--rounds 20]

Prints milliseconds of CPU per render (best of ``rounds``) and the prompt's tokens.
Chat-template families use the simulator's byte vocabulary and a BPE trained on the
conversation's own words (tokens of several characters, as a real model's)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from steno.schemas.api import CreateResponseRequest
from steno.services.dialects import Dialect, chat_template_dialect
from steno.services.dialects.chat_template.families import FAMILIES
from steno.services.dialects.chat_template.files import files_for_family
from steno.services.dialects.chat_template.vocabulary import trained_tokenizer
from steno.services.dialects.harmony import HarmonyDialect
from steno.services.dialects.harmony.vocabulary import harmony_encoding


def conversation(turns: int, words: int) -> list[dict[str, Any]]:
    text = " ".join(f"word{index} is a thing that" for index in range(words))
    items: list[dict[str, Any]] = []
    for turn in range(turns):
        items.append({"type": "message", "role": "user", "content": f"question {turn}: {text}"})
        items.append({"type": "message", "role": "assistant", "content": f"answer {turn}: {text}"})
    return items


def best_ms(render: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        render()
        best = min(best, time.process_time() - started)
    return best * 1000


def measure(make: Callable[[], Dialect], first: CreateResponseRequest, rounds: int) -> tuple[float, float, int]:
    """(ms with nothing reused, ms for the next turn, the prompt's tokens)."""
    fresh = [make() for _ in range(rounds)]
    cold = best_ms(lambda: fresh.pop().render(first, 0, reuse_scope="t"), rounds)
    dialect = make()
    tokens = len(dialect.render(first, 0, reuse_scope="t").token_ids)
    assert isinstance(first.input, list)
    next_turns = [first.model_copy(update={"input": [*first.input, {"type": "message", "role": "user",
                                                                     "content": f"and then {index}?"}]})
                  for index in range(rounds)]
    warm = best_ms(lambda: dialect.render(next_turns.pop(), 0, reuse_scope="t"), rounds)
    return cold, warm, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Small enough to be rendered in the API's own process (services/api/rendering.py).
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--words", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    items = conversation(args.turns, args.words)
    first = CreateResponseRequest(model="m", input=[*items, {"type": "message", "role": "user", "content": "next?"}],
                                  instructions="Be brief. " * 50)
    makers: list[tuple[str, Callable[[], Dialect]]] = [("harmony", lambda: HarmonyDialect(harmony_encoding()))]
    for family in ("qwen3", "llama3"):
        files = files_for_family(FAMILIES[family])
        trained = trained_tokenizer([" ".join(str(item["content"]) for item in items)], 2000,
                                    FAMILIES[family].special_tokens)
        makers.append((f"{family} (bytes)", partial(chat_template_dialect, files)))
        makers.append((f"{family} (trained BPE)", partial(chat_template_dialect,
                                                          files.model_copy(update={"tokenizer": trained.to_str()}))))
    for name, make in makers:
        cold, warm, tokens = measure(make, first, args.rounds)
        print(f"{name:22} {len(first.model_dump_json()):7,} characters {tokens:7,} tokens  "
              f"nothing reused {cold:7.2f} ms  the next turn {warm:7.2f} ms")


if __name__ == "__main__":
    main()
