"""Constrained answers for chat-template models: the xgrammar structural tag (as vLLM
takes it) for a completion whose answer is JSON matching a schema (pure).

For a model that reasons, scope ``final`` lets the reasoning block run free, whether the
model opens it or the prompt already did, and constrains what follows its closing tag;
scope ``whole`` (and a model that does not reason) constrains the whole completion."""

from __future__ import annotations

from typing import Any

from steno.services.dialects.base import StructuredOutputScope


def _json(schema: dict[str, Any], max_whitespace: int | None) -> dict[str, Any]:
    content: dict[str, Any] = {"type": "json_schema", "json_schema": schema}
    if max_whitespace is not None:
        content["max_whitespace_cnt"] = max_whitespace
    return content


def answer_grammar(schema: dict[str, Any], scope: StructuredOutputScope, max_whitespace: int | None,
                   reasoning_tags: tuple[str, str] | None) -> dict[str, Any]:
    answer = _json(schema, max_whitespace)
    if scope == "whole" or reasoning_tags is None:
        return {"type": "structural_tag", "format": answer}
    open_tag, close_tag = reasoning_tags
    reasoning = {"type": "sequence", "elements": [
        {"type": "optional", "content": {"type": "const_string", "value": open_tag}},
        {"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": close_tag},
        # Models leave a blank line between the block and the answer.
        {"type": "regex", "pattern": r"\s*"},
    ]}
    return {"type": "structural_tag", "format": {"type": "sequence", "elements": [reasoning, answer]}}
