"""Constrained answers in Harmony: the xgrammar structural tag for a completion whose
final message is JSON matching a schema (pure).

vLLM applies a ``text.format`` to a gpt-oss model's *final* message only in its OpenAI
server layer (its Harmony parser rewrites the constraint into a structural tag), while
``AsyncLLM``, which Steno's worker drives, applies whatever it is given from the first
completion token. So the tag is built here: an optional free ``analysis`` message, then
a ``final`` message whose header declares JSON and whose content must match the schema,
closed by a stop token (``<|return|>``). Unlike vLLM's tag, the Harmony framing is
matched as special *tokens*, not as text: matching the text also admits the same text
spelled with ordinary tokens ("<", "|", "channel", ...), which is not Harmony. Scope
``whole`` constrains the entire completion to the JSON instead (for a model that does
not speak Harmony). With a ``text.format`` the model cannot call tools in that turn (as
in vLLM)."""

from __future__ import annotations

from typing import Any

from steno.services.dialects.base import StructuredOutputScope

# Harmony's control tokens (o200k_harmony ids; checked against openai-harmony in the tests).
CHANNEL, MESSAGE, END, START, CONSTRAIN = 200005, 200008, 200007, 200006, 200003
# Every id from here up is a special or reserved token; none belongs inside a message.
FIRST_SPECIAL_TOKEN, HARMONY_VOCAB_SIZE = 199998, 201088
# Texts that may not appear inside constrained JSON strings (and keys): xgrammar matches
# JSON by text, and every special token's text would fit in a string, where the token
# would end or break the Harmony message. Spelling them out is banned with them.
SPECIAL_TEXTS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>",
                 "<|startoftext|>", "<|endoftext|>", "<|endofprompt|>", "<|reserved_"]


def _token(token_id: int) -> dict[str, Any]:
    return {"type": "token", "token": token_id}


def _text(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def json_format(schema: dict[str, Any], max_whitespace: int | None) -> dict[str, Any]:
    content: dict[str, Any] = {"type": "json_schema", "json_schema": schema, "excludes": SPECIAL_TEXTS}
    if max_whitespace is not None:
        content["max_whitespace_cnt"] = max_whitespace
    return content


def final_json_tag(schema: dict[str, Any], max_whitespace: int | None) -> dict[str, Any]:
    """The structural tag for a Harmony completion (the prompt ends with
    ``<|start|>assistant``) whose final message must be JSON matching ``schema``:

        [<|channel|>analysis<|message|> free text <|end|><|start|>assistant]
        <|channel|>final( <|constrain|>json| json)<|message|> JSON

    then a stop token (``<|return|>``), the only thing xgrammar allows once the grammar
    is complete. These are the shapes vLLM's gpt-oss parser accepts for a JSON format."""
    specials = list(range(FIRST_SPECIAL_TOKEN, HARMONY_VOCAB_SIZE))
    analysis = {
        "type": "optional",
        "content": {
            "type": "sequence",
            "elements": [
                _token(CHANNEL), _text("analysis"), _token(MESSAGE),
                {"type": "any_tokens", "exclude_tokens": specials},
                _token(END), _token(START), _text("assistant"),
            ],
        },
    }
    final = {
        "type": "sequence",
        "elements": [
            _token(CHANNEL), _text("final"),
            {"type": "or", "elements": [
                {"type": "sequence", "elements": [_text(" "), _token(CONSTRAIN), _text("json")]},
                _text(" json"),
            ]},
            _token(MESSAGE),
            json_format(schema, max_whitespace),
        ],
    }
    return {"type": "structural_tag", "format": {"type": "sequence", "elements": [analysis, final]}}


def answer_grammar(schema: dict[str, Any], scope: StructuredOutputScope, max_whitespace: int | None) -> dict[str, Any]:
    if scope == "final":
        return final_json_tag(schema, max_whitespace)
    return {"type": "structural_tag", "format": json_format(schema, max_whitespace)}
