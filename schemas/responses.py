"""Per-response facts the API records for the parser (``responses.parse_context``)."""

from __future__ import annotations

from pydantic import BaseModel

# The format a response's events are written in, recorded with it so that a log is
# re-parsed as it was written: 2 adds ``logprobs`` to every output_text part.
LOG_FORMAT = 2
LOG_FORMAT_PART_LOGPROBS = 2


class ReasoningSealing(BaseModel):
    """Reasoning items carry their text sealed (``include: ["reasoning.encrypted_content"]``)
    with this key, for this tenant (services/common/reasoning_seal.py)."""

    key_id: str
    tenant: str


class ParseContext(BaseModel):
    """What the parser must know of the request to interpret the model's output."""

    # The log format (LOG_FORMAT); contexts recorded before it was kept are format 1.
    v: int = 1
    include_logprobs: bool = False
    prompt_tokens: int = 0
    # Qualified names the model was offered under ``functions.``: plain tools "name",
    # namespaced tools "namespace.name".
    function_tools: list[str] = []
    # Qualified names of custom (freeform) tools among them.
    custom_tools: list[str] = []
    namespaces: list[str] = []
    # Whether a client-executed tool search was offered (as the function "tool_search").
    tool_search: bool = False
    # The built-in tools the client runs that were offered, as functions of these names:
    # "shell", "local_shell", "apply_patch".
    client_tools: list[str] = []
    # The model's format (``services/dialects``); contexts recorded before there was a
    # choice are Harmony's.
    dialect: str = "harmony"
    # A chat-template model's files (ChatTemplateFiles) by digest.
    dialect_files: str | None = None
    # The prompt opened the model's reasoning block: its output starts inside it.
    reasoning_open: bool = False
    # Qualified function name -> parameter -> its JSON schema type, for a model that
    # writes arguments as text (Qwen3-Coder's XML calls).
    parameter_types: dict[str, dict[str, str]] = {}
    reasoning_sealing: ReasoningSealing | None = None
