"""Model dialects: the one place that knows a model's format (see ``base.py``).

Each service looks a dialect up by the name a model declares (workers register it with
their model; the API records it in each response's parse context, where the parser
reads it)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from steno.services.dialects.base import (
    CompletionMessage,
    CompletionSplitter,
    Dialect,
    Fragment,
    Grammar,
    InvalidInput,
    MalformedOutput,
    MessageEnded,
    MessageStarted,
    OfferedTool,
    PromptFacts,
    RenderedPrompt,
    StructuredOutputScope,
    TextDelta,
)

__all__ = [
    "DEFAULT_DIALECT",
    "DIALECTS",
    "CompletionMessage",
    "CompletionSplitter",
    "Dialect",
    "Fragment",
    "Grammar",
    "InvalidInput",
    "MalformedOutput",
    "MessageEnded",
    "MessageStarted",
    "OfferedTool",
    "PromptFacts",
    "RenderedPrompt",
    "StructuredOutputScope",
    "TextDelta",
    "UnknownDialect",
    "dialect_named",
    "load_all",
]

DEFAULT_DIALECT = "harmony"


def _harmony() -> Dialect:
    from steno.services.dialects.harmony import HarmonyDialect
    from steno.services.dialects.harmony.vocabulary import harmony_encoding

    return HarmonyDialect(harmony_encoding())


# Name -> how to build it (once per process: a dialect holds its vocabulary and caches).
DIALECTS: dict[str, Callable[[], Dialect]] = {"harmony": _harmony}


class UnknownDialect(LookupError):
    pass


@cache
def dialect_named(name: str) -> Dialect:
    build = DIALECTS.get(name)
    if build is None:
        raise UnknownDialect(f"no dialect named {name!r} (known: {', '.join(sorted(DIALECTS))})")
    return build()


def load_all() -> None:
    """Builds every dialect now (a vocabulary takes a moment to load), so that the first
    request of each does not wait for it."""
    for name in DIALECTS:
        dialect_named(name)
