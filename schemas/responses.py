"""Per-response facts the API records for the parser (``responses.parse_context``)."""

from __future__ import annotations

from pydantic import BaseModel


class ParseContext(BaseModel):
    v: int = 1
    include_logprobs: bool = False
