"""Identifiers. A response id is random but for its origin (the API process that made
it, so the subject its events are announced on leads there); everything inside a
response derives from the id and a position, so rebuilding a response yields the same
ids."""

from __future__ import annotations

import hashlib
import secrets

ORIGIN_CHARS = 8


def new_origin() -> str:
    return secrets.token_hex(ORIGIN_CHARS // 2)


def new_response_id(origin: str | None = None) -> str:
    """``resp_`` + the origin (random when not given) + 40 random hex characters."""
    return "resp_" + (origin or new_origin()) + secrets.token_hex(20)


def origin_of(response_id: str) -> str:
    return response_id[5:5 + ORIGIN_CHARS]


def derived_id(prefix: str, response_id: str, position: int) -> str:
    digest = hashlib.blake2b(f"{response_id}/{position}/{prefix}".encode(), digest_size=16)
    return f"{prefix}_{digest.hexdigest()}"


def new_conversation_id() -> str:
    """``conv_`` + 48 random hex characters."""
    return "conv_" + secrets.token_hex(24)


def new_item_id(prefix: str) -> str:
    """The id of an item added to a conversation without one: random, since it belongs
    to no response whose id it could derive from."""
    return f"{prefix}_{secrets.token_hex(24)}"
