"""What a request may hold beyond its schema, checked before anything is stored or
rendered (pure). Each limit keeps one request from failing deep inside the pipeline
(or taking a process with it): Postgres text cannot hold a NUL, JSON encoders refuse
integers beyond 64 bits and lone surrogates, and recursive code has a depth limit."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from steno.schemas.api import CreateResponseRequest
from steno.services.api.errors import ApiError

# Objects and arrays inside any free-form field (input items, tool schemas, formats).
MAX_DEPTH = 64
MIN_INT, MAX_INT = -(2**63), 2**63 - 1
# Response and item ids as Steno makes them, and as clients may name their own items.
_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def _invalid(param: str, message: str) -> ApiError:
    return ApiError(400, f"Invalid value for '{param}': {message}", param=param, code="invalid_value")


def _check(value: Any, param: str, depth: int) -> None:
    if isinstance(value, str):
        if "\x00" in value:
            raise _invalid(param, "text may not contain NUL (U+0000).")
        if not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:
                raise _invalid(param, "text may not contain unpaired surrogates.") from None
    elif isinstance(value, bool) or value is None or isinstance(value, float):
        return
    elif isinstance(value, int):
        if not MIN_INT <= value <= MAX_INT:
            raise _invalid(param, "integers must fit in 64 bits.")
    elif depth >= MAX_DEPTH:
        raise _invalid(param, f"nested more than {MAX_DEPTH} levels deep.")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check(key, param, depth)
            _check(item, f"{param}.{key}", depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check(item, f"{param}[{index}]", depth + 1)
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            _check(getattr(value, name), f"{param}.{name}" if param else name, depth + 1)


def check_request(request: CreateResponseRequest) -> None:
    """Raises a 400 naming the offending field."""
    _check(request, "", 0)
    if request.previous_response_id is not None and not is_id(request.previous_response_id):
        raise _invalid("previous_response_id", "not a response id.")
    _check_item_ids(request.input if isinstance(request.input, list) else [], "input")


def check_items(items: list[dict[str, Any]], where: str) -> None:
    """Items added to a conversation (``where`` names them), held to what a request's
    input items are: raises a 400 naming the offending field."""
    _check(items, where, 1)  # as deep as a request's input list
    _check_item_ids(items, where)


def _check_item_ids(items: list[dict[str, Any]], where: str) -> None:
    for index, item in enumerate(items):
        if "id" in item and not (isinstance(item["id"], str) and is_id(item["id"])):
            raise _invalid(f"{where}[{index}].id", "an item id is a string of letters, digits, '_', '-', '.' or ':'.")


def is_id(value: str) -> bool:
    """Whether ``value`` can be an id Steno made or stored (anything else names nothing)."""
    return bool(_ID.match(value))
