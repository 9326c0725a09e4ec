"""Model dialects: the one place that knows a model's format (see ``base.py``).

Each service looks a dialect up by the name a model declares (workers register it with
their model; the API records it in each response's parse context, where the parser
reads it) and, for a dialect built from the model's own files (a chat template and its
tokenizer), the digest of those files. Files are read from a local directory
(``STENO_MODEL_FILES_DIR``) that the services fill from the bus's model files store
(``services/common/model_files.py``) before they ask."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache, lru_cache
from pathlib import Path

from steno.schemas.bus import ChatTemplateFiles
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
    "CHAT_TEMPLATE",
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
    "chat_template_dialect",
    "dialect_for",
    "dialect_named",
    "load_all",
    "model_files_dir",
]

DEFAULT_DIALECT = "harmony"
CHAT_TEMPLATE = "chat_template"


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


def chat_template_dialect(files: ChatTemplateFiles) -> Dialect:
    from steno.services.dialects.chat_template.dialect import ChatTemplateDialect

    return ChatTemplateDialect(files)


def model_files_dir() -> Path:
    """Where model files fetched from the bus are kept, one ``<digest>.json`` each."""
    configured = os.environ.get("STENO_MODEL_FILES_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "steno" / "model-files"


@lru_cache(maxsize=16)
def _from_files(digest: str) -> Dialect:
    path = model_files_dir() / f"{digest}.json"
    try:
        files = ChatTemplateFiles.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise UnknownDialect(f"the model files {digest} are not in {model_files_dir()}") from None
    return chat_template_dialect(files)


def dialect_for(name: str, files: str | None) -> Dialect:
    """The dialect ``name``, built from the model files of digest ``files`` where it needs
    them (they must be in ``model_files_dir()``)."""
    if name == CHAT_TEMPLATE:
        if files is None:
            raise UnknownDialect("a chat-template model needs its files")
        return _from_files(files)
    return dialect_named(name)


def load_all() -> None:
    """Builds every dialect now (a vocabulary takes a moment to load), so that the first
    request of each does not wait for it."""
    for name in DIALECTS:
        dialect_named(name)
