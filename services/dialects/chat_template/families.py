"""The chat-template families Steno knows: each one's stored template, the markers its
prompts and outputs use, the tokens that end its turns, its reasoning tags and its
tool-call format, and which family a Hugging Face model directory belongs to."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

# Reasoning efforts that ask for no reasoning at all.
NO_REASONING = frozenset({"none"})

_THINK = ("<think>", "</think>")


def _deepseek(name: str) -> str:
    """A DeepSeek marker: full-width bars around the name, its spaces written U+2581."""
    return "<\uff5c" + name.replace(" ", "\u2581") + "\uff5c>"


@dataclass(frozen=True)
class Family:
    name: str
    # The file under templates/ holding the family's chat template.
    template_file: str
    # Every marker the template and the model's output use; each is one token of the family's tokenizer.
    special_tokens: tuple[str, ...]
    bos_token: str | None
    # The token that ends an assistant turn (the engine stops at it).
    eos_token: str
    # Every token that ends a turn.
    stop_tokens: tuple[str, ...]
    # (open tag, close tag) of the model's reasoning, or None for a model that does not reason.
    reasoning: tuple[str, str] | None
    # One of "hermes", "llama3_json", "mistral", "qwen3_coder", "deepseek_v3".
    tool_call_format: str
    # The template variable that turns reasoning on or off, for families whose templates have one.
    thinking_switch: str | None = None

    def template_kwargs(self, effort: str | None) -> dict[str, Any]:
        """The template arguments for a request's ``reasoning.effort``: the family's switch,
        off for ``none``, on for any other effort; nothing when no effort is asked for, so
        that the template's default holds."""
        if effort is None or self.thinking_switch is None:
            return {}
        return {self.thinking_switch: effort not in NO_REASONING}

    def template(self) -> str:
        return _stored_template(self.template_file)


_PACKAGE = __name__.rpartition(".")[0]


@functools.cache
def _stored_template(file_name: str) -> str:
    return resources.files(_PACKAGE).joinpath("templates", file_name).read_text(encoding="utf-8")


_DEEPSEEK_TOOL_MARKERS = tuple(_deepseek(name) for name in (
    "tool calls begin", "tool calls end", "tool call begin", "tool call end", "tool sep",
    "tool outputs begin", "tool outputs end", "tool output begin", "tool output end",
))

HERMES = Family(
    # NousResearch Hermes 2 Pro: ChatML turns, the tools announced before the first, calls in <tool_call>.
    name="hermes",
    template_file="hermes.jinja",
    special_tokens=("<s>", "</s>", "<|im_start|>", "<|im_end|>", "<tools>", "</tools>", "<tool_call>", "</tool_call>",
                    "<tool_response>", "</tool_response>"),
    bos_token="<s>",
    eos_token="<|im_end|>",
    stop_tokens=("<|im_end|>", "</s>"),
    reasoning=None,
    tool_call_format="hermes",
)

LLAMA3 = Family(
    # Llama 3.1 / 3.2 with JSON tool calls; <|eom_id|> ends a turn that awaits a built-in tool's result.
    name="llama3",
    template_file="llama3.jinja",
    special_tokens=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                    "<|eom_id|>", "<|python_tag|>"),
    bos_token="<|begin_of_text|>",
    eos_token="<|eot_id|>",
    stop_tokens=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
    reasoning=None,
    tool_call_format="llama3_json",
)

MISTRAL = Family(
    # Mistral Instruct v0.3 style: [AVAILABLE_TOOLS] before the last user turn, calls after [TOOL_CALLS].
    name="mistral",
    template_file="mistral.jinja",
    special_tokens=("<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]",
                    "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
    bos_token="<s>",
    eos_token="</s>",
    stop_tokens=("</s>",),
    reasoning=None,
    tool_call_format="mistral",
)

QWEN3 = Family(
    # Qwen3: ChatML, <think> reasoning switched by enable_thinking, Hermes-style <tool_call> JSON.
    name="qwen3",
    template_file="qwen3.jinja",
    special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                    "<tool_response>", "</tool_response>"),
    bos_token=None,
    eos_token="<|im_end|>",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    reasoning=_THINK,
    tool_call_format="hermes",
    thinking_switch="enable_thinking",
)

DEEPSEEK = Family(
    # DeepSeek R1 with V3's tool-call markup. Its template has no switch, and its
    # generation prompt stops at the assistant marker: the model opens <think> itself.
    # DeepSeek V3.1's templates read ``thinking``, so the family passes it.
    name="deepseek",
    template_file="deepseek.jinja",
    special_tokens=(_deepseek("begin of sentence"), _deepseek("end of sentence"), _deepseek("User"),
                    _deepseek("Assistant"), *_THINK, *_DEEPSEEK_TOOL_MARKERS),
    bos_token=_deepseek("begin of sentence"),
    eos_token=_deepseek("end of sentence"),
    stop_tokens=(_deepseek("end of sentence"),),
    reasoning=_THINK,
    tool_call_format="deepseek_v3",
    thinking_switch="thinking",
)

FAMILIES: dict[str, Family] = {family.name: family for family in (HERMES, LLAMA3, MISTRAL, QWEN3, DEEPSEEK)}

_BY_MODEL_TYPE: dict[str, Family] = {
    "qwen2": QWEN3, "qwen2_moe": QWEN3, "qwen3": QWEN3, "qwen3_moe": QWEN3, "qwen3_next": QWEN3,
    "llama": LLAMA3,
    "mistral": MISTRAL, "mixtral": MISTRAL,
    "deepseek_v2": DEEPSEEK, "deepseek_v3": DEEPSEEK,
}

# Architecture class name prefixes, for a config.json without a model_type.
_BY_ARCHITECTURE: tuple[tuple[str, Family], ...] = (
    ("Qwen2", QWEN3), ("Qwen3", QWEN3), ("Llama", LLAMA3), ("Mistral", MISTRAL), ("Mixtral", MISTRAL),
    ("DeepseekV2", DEEPSEEK), ("DeepseekV3", DEEPSEEK),
)


def _template_text(tokenizer_config: Mapping[str, Any]) -> str:
    template = tokenizer_config.get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):  # named templates ("default", "tool_use", ...)
        return "\n".join(t["template"] for t in template if isinstance(t, dict) and isinstance(t.get("template"), str))
    return ""


def _family_by_config(config: Mapping[str, Any]) -> Family | None:
    # A multimodal model names its language model's type under text_config.
    text_config = config.get("text_config")
    text_type = text_config.get("model_type") if isinstance(text_config, Mapping) else None
    model_types = [config.get("model_type"), text_type]
    for model_type in model_types:
        if isinstance(model_type, str) and model_type.lower() in _BY_MODEL_TYPE:
            return _BY_MODEL_TYPE[model_type.lower()]
    architectures = config.get("architectures")
    for architecture in architectures if isinstance(architectures, list) else []:
        for prefix, family in _BY_ARCHITECTURE:
            if isinstance(architecture, str) and architecture.startswith(prefix):
                return family
    return None


def _family_by_template(template: str, by_config: Family | None) -> Family | None:
    """The family whose markup the template writes, where it is unmistakable. Fine-tunes
    keep their base's model_type but bring their own format (Hermes 3 is a Llama,
    DeepSeek-R1's distillations are Llamas and Qwens), and the prompt and the output
    follow the template."""
    if _deepseek("User") in template or _deepseek("tool calls begin") in template:
        return DEEPSEEK
    if "<|start_header_id|>" in template:
        return LLAMA3
    if "[INST]" in template or "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<tool_call>" in template and "<function=" in template:
        return dataclasses.replace(QWEN3, tool_call_format="qwen3_coder")
    if "<tool_call>" in template:
        # ChatML with Hermes-style calls: Qwen's own, or a Hermes fine-tune of another base.
        return QWEN3 if by_config is QWEN3 else HERMES
    return None


def family_for_model(config: Mapping[str, Any], tokenizer_config: Mapping[str, Any]) -> Family | None:
    """The family of a Hugging Face model from its ``config.json`` and
    ``tokenizer_config.json``: by the markup its chat template writes where that is
    unmistakable (a Qwen3-Coder template, ``<tool_call>`` with ``<function=``, gives the
    qwen3 family with the ``qwen3_coder`` format), else by ``model_type`` or
    ``architectures``; None when neither says."""
    by_config = _family_by_config(config)
    return _family_by_template(_template_text(tokenizer_config), by_config) or by_config
