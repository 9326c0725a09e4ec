"""The Conversations service: what ``/v1/conversations`` does, apart from HTTP, and what
a response made in a conversation needs of it (its history, and its turn appended).

A conversation is an ordered log of items kept in Postgres (``conversation_store.py``):
items added to it, and each response made in it, its input items then its output.
Items are checked as a response's input items are, before anything is stored. A
response on a conversation whose latest response is still running is refused (409
``conversation_busy``), so the conversation's order is the order of finished turns.
Every lookup is scoped to the caller's tenant: another tenant's conversation is the same
404 as a missing one."""

from __future__ import annotations

import contextlib
import typing
from typing import Any

from openai.types.conversations.conversation_item import ConversationItem

from steno.schemas.api import (
    CreateConversationItemsRequest,
    CreateConversationRequest,
    CreateResponseRequest,
    UpdateConversationRequest,
)
from steno.schemas.ids import new_conversation_id, new_item_id
from steno.services.api.conversation_store import (
    ConversationBusy,
    ConversationMissing,
    ConversationStore,
    ItemsAlreadyInConversation,
    StoredConversation,
)
from steno.services.api.errors import ApiError
from steno.services.api.item_references import resolved_references
from steno.services.api.limits import check_items, is_id
from steno.services.api.store import ResponseStore
from steno.services.dialects import InvalidInput
from steno.services.dialects.conversation import declared_tools, read_items
from steno.services.dialects.tools import tool_catalog

# What an item added without an id is called, as OpenAI names these kinds.
_ID_PREFIXES = {"message": "msg", "function_call": "fc", "reasoning": "rs"}


def _kinds_with_status() -> frozenset[str]:
    """The item types whose SDK type requires a ``status`` (OpenAI fills it in on items
    it returns)."""
    members = typing.get_args(typing.get_args(ConversationItem)[0])
    return frozenset(
        kind for member in members if (status := member.model_fields.get("status")) and status.is_required()
        for kind in typing.get_args(member.model_fields["type"].annotation))


_KINDS_WITH_STATUS = _kinds_with_status()


def as_conversation_item(item: dict[str, Any]) -> dict[str, Any]:
    """An item as a conversation keeps and lists it: typed, with an id, message text as
    content parts, and a status where the SDK's types expect one."""
    item = dict(item)
    kind = item.setdefault("type", "message")
    if "id" not in item:
        item["id"] = new_item_id(_ID_PREFIXES.get(str(kind), "item"))
    if kind == "message" and isinstance(item.get("content"), str):
        part_type = "output_text" if item.get("role") == "assistant" else "input_text"
        item["content"] = [{"type": part_type, "text": item["content"]}]
    if kind == "message" and isinstance(item.get("content"), list):
        item["content"] = [{**part, "annotations": []} if isinstance(part, dict) and part.get("type") == "output_text"
                           and "annotations" not in part else part for part in item["content"]]
    if kind in _KINDS_WITH_STATUS:
        item.setdefault("status", "completed")
    return item


def item_list(items: list[dict[str, Any]], has_more: bool = False) -> dict[str, Any]:
    """The SDK's ``ConversationItemList``."""
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }


def _not_found(conversation_id: str, param: str = "conversation_id") -> ApiError:
    named = f" with id '{conversation_id}'" if is_id(conversation_id) else ""  # nothing else is echoed back
    return ApiError(404, f"Conversation{named} not found.", param=param)


def _item_not_found(item_id: str, param: str = "item_id") -> ApiError:
    named = f" with id '{item_id}'" if is_id(item_id) else ""
    return ApiError(404, f"No item found{named}.", param=param)


def _already_in(exc: ItemsAlreadyInConversation, param: str) -> ApiError:
    return ApiError(400, f"Item already in conversation: {', '.join(exc.item_ids)}. An item id is used once in a "
                    "conversation, deleted items' included.", param=param, code="item_already_in_conversation")


def _refuse_repeated_ids(items: list[dict[str, Any]], where: str) -> None:
    seen: set[str] = set()
    for index, item in enumerate(items):
        if item["id"] in seen:
            raise ApiError(400, f"Item id '{item['id']}' appears twice; an item id is used once in a conversation.",
                           param=f"{where}[{index}].id", code="item_already_in_conversation")
        seen.add(item["id"])


class ConversationsService:
    def __init__(self, store: ConversationStore, responses: ResponseStore) -> None:
        """``responses``: where ``item_reference`` items find what they name."""
        self._store = store
        self._responses = responses

    async def create(self, request: CreateConversationRequest, tenant: str) -> dict[str, Any]:
        items = await self._checked_items(request.items, tenant, history=[])
        stored = await self._store.create(new_conversation_id(), tenant, request.metadata or {}, items)
        return stored.as_object()

    async def retrieve(self, conversation_id: str, tenant: str) -> dict[str, Any]:
        return (await self._owned(conversation_id, tenant)).as_object()

    async def update(self, conversation_id: str, request: UpdateConversationRequest, tenant: str) -> dict[str, Any]:
        if not is_id(conversation_id):
            raise _not_found(conversation_id)
        updated = await self._store.update_metadata(conversation_id, tenant, request.metadata or {})
        if updated is None:
            raise _not_found(conversation_id)
        return updated.as_object()

    async def delete(self, conversation_id: str, tenant: str) -> dict[str, Any]:
        """Deletes the conversation and its items; the responses made in it stay (each
        retrievable as before)."""
        if not is_id(conversation_id) or not await self._store.delete(conversation_id, tenant):
            raise _not_found(conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    async def add_items(self, conversation_id: str, request: CreateConversationItemsRequest,
                        tenant: str) -> dict[str, Any]:
        """Appends the items: the list of those added, as stored."""
        await self._owned(conversation_id, tenant)
        # Outputs answer calls that may be earlier items of the conversation.
        items = await self._checked_items(request.items, tenant, history=await self._store.items(conversation_id))
        try:
            await self._store.append_items(conversation_id, tenant, items)
        except ConversationMissing:
            raise _not_found(conversation_id) from None  # deleted meanwhile
        except ItemsAlreadyInConversation as exc:
            raise _already_in(exc, "items") from None
        return item_list(items)

    async def list_items(self, conversation_id: str, tenant: str, after: str | None, limit: int,
                         descending: bool) -> dict[str, Any]:
        await self._owned(conversation_id, tenant)
        page = None
        if after is None or is_id(after):
            page = await self._store.items_page(conversation_id, after, limit, descending)
        if page is None:
            raise _item_not_found(after or "", param="after")
        return item_list(page.items, page.has_more)

    async def item(self, conversation_id: str, item_id: str, tenant: str) -> dict[str, Any]:
        await self._owned(conversation_id, tenant)
        found = await self._store.item(conversation_id, item_id) if is_id(item_id) else None
        if found is None:
            raise _item_not_found(item_id)
        return found

    async def delete_item(self, conversation_id: str, item_id: str, tenant: str) -> dict[str, Any]:
        """Leaves the item out of the conversation (and of later responses' history): the
        conversation, as OpenAI answers."""
        conversation = await self._owned(conversation_id, tenant)
        if not is_id(item_id) or not await self._store.delete_item(conversation_id, item_id):
            raise _item_not_found(item_id)
        return conversation.as_object()

    async def history(self, conversation_id: str, tenant: str, *, for_new_turn: bool) -> list[dict[str, Any]]:
        """The conversation's items, the history of a response made in it. For a new
        turn, a 409 while its previous response is still running (checked again, race
        free, when the turn is appended)."""
        await self._owned(conversation_id, tenant, param="conversation")
        if for_new_turn and (running := await self._store.running_response(conversation_id)) is not None:
            raise _busy(conversation_id, running)
        return await self._store.items(conversation_id)

    async def append_response(self, conversation_id: str, tenant: str, response_id: str,
                              input_items: list[dict[str, Any]]) -> None:
        """Makes a stored response that is not queued yet the conversation's next turn:
        its input items, then its output once it has ended."""
        items = [as_conversation_item(item) for item in input_items]
        _refuse_repeated_ids(items, "input")
        try:
            await self._store.append_response(conversation_id, tenant, response_id, items)
        except ConversationMissing:
            raise _not_found(conversation_id, param="conversation") from None
        except ConversationBusy as exc:
            raise _busy(conversation_id, exc.response_id) from None
        except ItemsAlreadyInConversation as exc:
            raise _already_in(exc, "input") from None

    async def _owned(self, conversation_id: str, tenant: str, param: str = "conversation_id") -> StoredConversation:
        """The caller's conversation, or the same 404 whether it is missing or another tenant's."""
        if not is_id(conversation_id):
            raise _not_found(conversation_id, param)
        stored = await self._store.get(conversation_id, tenant)
        if stored is None:
            raise _not_found(conversation_id, param)
        return stored

    async def _checked_items(self, items: list[dict[str, Any]], tenant: str,
                             history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``items`` as the conversation will keep them, checked as a response's input
        items are (a 400 naming the field, before anything is stored)."""
        check_items(items, "items")
        for index, item in enumerate(items):
            if not isinstance(item.get("type", "message"), str):
                raise ApiError(400, "An item's type must be a string.", param=f"items[{index}].type",
                               code="invalid_value")
        items = [as_conversation_item(item) for item in await resolved_references(items, self._responses, tenant,
                                                                                     "items")]
        _refuse_repeated_ids(items, "items")
        try:
            catalog = tool_catalog(declared_tools(CreateResponseRequest(model="-", input=items), []))
            # The calls earlier items made, which outputs among the new items may answer.
            # An earlier item the reader refuses (its call deleted since) answers nothing
            # and stops no new item.
            call_authors: dict[str, str] = {}
            for earlier in history:
                with contextlib.suppress(InvalidInput):
                    read_items([earlier], [], catalog, call_authors, where="history")
            read_items(items, [], catalog, call_authors, where="items")
        except InvalidInput as exc:
            param = exc.param.replace("input[", "items[", 1) if exc.param.startswith("input[") else exc.param
            raise ApiError(400, str(exc), param=param, code="invalid_value") from exc
        except Exception as exc:  # as rendering answers what the reader trips over: the items' fault
            raise ApiError(400, f"The items could not be read ({type(exc).__name__}).", param="items",
                           code="invalid_value") from exc
        return items


def _busy(conversation_id: str, running: str) -> ApiError:
    return ApiError(409, f"Conversation '{conversation_id}' has a response in progress ({running}); a response in a "
                    "conversation starts once the previous one has ended. Wait for it to end (or cancel it), "
                    "then retry.", param="conversation", code="conversation_busy")
