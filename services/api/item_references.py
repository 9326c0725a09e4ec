"""``item_reference`` items, replaced by the stored items they name: in a response's
input and in items added to a conversation alike."""

from __future__ import annotations

from typing import Any

from steno.services.api.errors import ApiError
from steno.services.api.limits import check_items, is_id
from steno.services.api.store import ResponseStore


async def resolved_references(items: list[Any], store: ResponseStore, tenant: str, where: str) -> list[Any]:
    """``items`` with each ``item_reference`` replaced by the tenant's stored item it
    names (``items`` itself when there are none); ``where`` names the list in errors."""
    wanted = {index: item.get("id") for index, item in enumerate(items)
              if isinstance(item, dict) and item.get("type") == "item_reference"}
    if not wanted:
        return items
    for index, item_id in wanted.items():
        if not isinstance(item_id, str) or not is_id(item_id):
            raise ApiError(400, "An item_reference needs the id of a stored item.", param=f"{where}[{index}].id",
                           code="invalid_value")
    found = await store.items_by_id(tenant, sorted({str(item_id) for item_id in wanted.values()}))
    resolved = list(items)
    for index, item_id in wanted.items():
        if item_id not in found:
            raise ApiError(400, f"Item with id '{item_id}' not found.", param=f"{where}[{index}].id",
                           code="invalid_value")
        resolved[index] = found[str(item_id)]
    # A stored item is held to what the request could have sent in its place (a model's
    # output may hold a NUL, which a request may not).
    check_items(resolved, where)
    return resolved
