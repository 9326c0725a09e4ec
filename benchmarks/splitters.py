"""What reading a model's output costs the parser: completion tokens through each
dialect's splitter (Harmony; a chat-template family's decoder, reasoning and tool-call
parsers), fed in batches as the worker sends them.

    python -m steno.benchmarks.splitters [--paragraphs 40] [--batch 8] [--rounds 3]

Prints tokens and characters (of text read out) per second for each (best of ``rounds``);
a family without reasoning writes the answer alone. Chat-template
families are measured with a BPE trained on the answer's own text, so that tokens hold
several characters as a real model's do, and with the simulator's byte tokenizer."""

from __future__ import annotations

import argparse
import time

from steno.schemas.bus import ChatTemplateFiles
from steno.schemas.responses import ParseContext
from steno.services.dialects import CompletionMessage, Dialect, TextDelta, chat_template_dialect, dialect_named
from steno.services.dialects.chat_template.families import FAMILIES
from steno.services.dialects.chat_template.files import files_for_family
from steno.services.dialects.chat_template.vocabulary import trained_tokenizer

PARAGRAPH = "The weather in Paris is sunny and warm today, with a light breeze from the west. Déjà vu. "


def measure(dialect: Dialect, context: ParseContext, text: str, batch: int, rounds: int) -> tuple[int, int, float]:
    """(tokens, characters of text read out of them, best seconds)."""
    tokens = dialect.write_completion([CompletionMessage("analysis", text), CompletionMessage("final", text)])
    best = float("inf")
    characters = 0
    for _ in range(rounds):
        splitter = dialect.splitter(context)
        started = time.perf_counter()
        fragments = []
        for at in range(0, len(tokens), batch):
            fragments += splitter.feed(tokens[at: at + batch])
        fragments += splitter.finish()
        best = min(best, time.perf_counter() - started)
        characters = sum(len(fragment.text) for fragment in fragments if isinstance(fragment, TextDelta))
    return len(tokens), characters, best


def with_trained_tokenizer(files: ChatTemplateFiles, text: str) -> ChatTemplateFiles:
    tokenizer = trained_tokenizer([text] * 4, 2000, FAMILIES[files.family].special_tokens)
    return files.model_copy(update={"tokenizer": tokenizer.to_str()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paragraphs", type=int, default=40)
    parser.add_argument("--batch", type=int, default=8, help="tokens per feed")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    text = PARAGRAPH * args.paragraphs
    runs: list[tuple[str, Dialect, ParseContext]] = [("harmony", dialect_named("harmony"), ParseContext())]
    for family in ("qwen3", "llama3"):
        for label, files in (("trained BPE", with_trained_tokenizer(files_for_family(FAMILIES[family]), text)),
                             ("bytes", files_for_family(FAMILIES[family]))):
            dialect = chat_template_dialect(files)
            context = ParseContext(dialect="chat_template", dialect_files=dialect.files,
                                   function_tools=["get_weather"])
            runs.append((f"{family} ({label})", dialect, context))
    for name, dialect, context in runs:
        count, characters, seconds = measure(dialect, context, text, args.batch, args.rounds)
        print(f"{name:22} {count:6} tokens  {count / seconds:12,.0f} tokens/s  {characters / seconds:12,.0f} chars/s")


if __name__ == "__main__":
    main()
