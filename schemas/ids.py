"""Identifiers. A response id is random; everything inside a response derives from it
and a position, so rebuilding a response yields the same ids."""

from __future__ import annotations

import hashlib
import secrets


def new_response_id() -> str:
    return "resp_" + secrets.token_hex(24)


def derived_id(prefix: str, response_id: str, position: int) -> str:
    digest = hashlib.blake2b(f"{response_id}/{position}/{prefix}".encode(), digest_size=16)
    return f"{prefix}_{digest.hexdigest()}"
