"""Per-response facts the API records for the parser (``responses.parse_context``)."""

from __future__ import annotations

from pydantic import BaseModel


class ParseContext(BaseModel):
    """What the parser must know of the request to interpret the model's output."""

    v: int = 1
    include_logprobs: bool = False
    prompt_tokens: int = 0
    # Qualified names the model was offered under ``functions.``: plain tools "name",
    # namespaced tools "namespace.name".
    function_tools: list[str] = []
    # Qualified names of custom (freeform) tools among them.
    custom_tools: list[str] = []
    namespaces: list[str] = []
    # The model's format (``services/dialects``); contexts recorded before there was a
    # choice are Harmony's.
    dialect: str = "harmony"
