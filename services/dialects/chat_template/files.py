"""A chat-template model's files (``ChatTemplateFiles``): read from a Hugging Face model
directory for a real model, or made for a family, for the simulator, which speaks the
family's format over a tokenizer of bytes and the family's markers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from steno.schemas.bus import ChatTemplateFiles
from steno.services.dialects.chat_template.families import FAMILIES, Family, family_for_model
from steno.services.dialects.chat_template.vocabulary import byte_level_tokenizer


class ModelFilesError(ValueError):
    """The model directory lacks what a chat-template model needs, or says it unclearly."""


def files_for_family(family: Family) -> ChatTemplateFiles:
    tokens = {"eos_token": family.eos_token}
    if family.bos_token is not None:
        tokens["bos_token"] = family.bos_token
    return ChatTemplateFiles(
        family=family.name,
        tokenizer=byte_level_tokenizer(family.special_tokens).to_str(),
        chat_template=family.template(),
        template_tokens=tokens,
        stop_tokens=[family.eos_token, *(t for t in family.stop_tokens if t != family.eos_token)],
        reasoning_tags=family.reasoning,
        tool_call_format=family.tool_call_format,
    )


def _json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelFilesError(f"{path} cannot be read: {exc}") from exc
    return value if isinstance(value, dict) else {}


def _token_text(value: Any) -> str | None:
    """A tokenizer_config token: a string, or an AddedToken written as a dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def has_chat_template(directory: Path) -> bool:
    """Whether ``directory`` holds a chat-template model (not gpt-oss, whose format is
    Harmony whatever its template says)."""
    if not directory.is_dir() or _json(directory / "config.json").get("model_type") == "gpt_oss":
        return False
    return (directory / "chat_template.jinja").exists() or \
        bool(_json(directory / "tokenizer_config.json").get("chat_template"))


def _chat_template(directory: Path, tokenizer_config: dict[str, Any]) -> str:
    standalone = directory / "chat_template.jinja"
    if standalone.exists():
        return standalone.read_text()
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one, else the tool-use one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("tool_use") or named.get("default")
    if not isinstance(template, str) or not template:
        raise ModelFilesError(f"{directory} has no chat template (tokenizer_config.json's chat_template or "
                              "chat_template.jinja); give one with --chat-template")
    return template


def files_from_directory(directory: Path, *, family: str | None = None, chat_template: Path | None = None,
                         tool_call_format: str | None = None, reasoning: bool | None = None) -> ChatTemplateFiles:
    """The files of the model in ``directory``; the family (and so its parsers) comes from
    its configuration unless given, and each parser can be overridden."""
    config = _json(directory / "config.json")
    tokenizer_config = _json(directory / "tokenizer_config.json")
    tokenizer_path = directory / "tokenizer.json"
    if not tokenizer_path.exists():
        raise ModelFilesError(f"{directory} has no tokenizer.json (a fast Hugging Face tokenizer)")
    template = chat_template.read_text() if chat_template is not None else _chat_template(directory, tokenizer_config)
    chosen = FAMILIES.get(family) if family else family_for_model(config, {**tokenizer_config,
                                                                           "chat_template": template})
    if chosen is None:
        raise ModelFilesError(f"the family of the model in {directory} is not recognised "
                              f"(model_type {config.get('model_type')!r}); name it with --chat-family "
                              f"({', '.join(sorted(FAMILIES))})")
    if tool_call_format is not None:
        chosen = dataclasses.replace(chosen, tool_call_format=tool_call_format)
    if reasoning is False:
        chosen = dataclasses.replace(chosen, reasoning=None)
    tokens = {name: text for name in ("bos_token", "eos_token", "pad_token", "unk_token")
              if (text := _token_text(tokenizer_config.get(name))) is not None}
    eos = tokens.get("eos_token", chosen.eos_token)
    return ChatTemplateFiles(
        family=chosen.name,
        tokenizer=tokenizer_path.read_text(),
        chat_template=template,
        template_tokens=tokens,
        stop_tokens=[eos, *(t for t in chosen.stop_tokens if t != eos)],
        reasoning_tags=chosen.reasoning,
        tool_call_format=chosen.tool_call_format,
    )
