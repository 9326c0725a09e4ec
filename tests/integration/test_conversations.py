"""The Conversations API, with the official SDK against the real stack: conversations and
their items, responses made in a conversation (its items are their history, their
input and output are appended to it), one turn at a time, within the caller's tenant,
and the Agents SDK's ``OpenAIConversationsSession`` running an agent over several turns.

The simulator echoes the user's last message ("Steno simulator reply: <text>"); offered
a function tool, it calls it with the user's text and then answers with what it
returned."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import openai
import pytest
from openai.types.conversations import Conversation, ConversationDeletedResource, ConversationItemList
from openai.types.conversations.conversation_item import ConversationItem
from pydantic import TypeAdapter

from tests.conftest import SLOW_MODEL

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"
REPLY = "Steno simulator reply: "
ITEM = TypeAdapter(ConversationItem)


def said(text: str, role: str = "user") -> dict[str, Any]:
    return {"type": "message", "role": role, "content": text}


def texts(items: list[Any]) -> list[str]:
    """What each message item says, in order."""
    return ["".join(part.text for part in item.content) for item in items if item.type == "message"]


def listed(client: openai.OpenAI, conversation_id: str) -> list[Any]:
    """Every item of the conversation, oldest first, as the SDK pages through them."""
    return list(client.conversations.items.list(conversation_id, order="asc", limit=3))


def wait_until_finished(client: openai.OpenAI, response_id: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while (response := client.responses.retrieve(response_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, response
        time.sleep(0.2)
    return response


def test_a_conversation_is_created_read_updated_and_deleted(client):
    created = client.conversations.create(metadata={"topic": "orders"}, items=[said("hello"), said("hi!", "assistant")])
    assert created.id.startswith("conv_") and len(created.id) == len("conv_") + 48
    assert (created.object, created.metadata) == ("conversation", {"topic": "orders"})
    assert abs(created.created_at - time.time()) < 60
    assert client.conversations.retrieve(created.id) == created
    updated = client.conversations.update(created.id, metadata={"topic": "refunds", "customer": "c-9"})
    assert updated.metadata == {"topic": "refunds", "customer": "c-9"} and updated.created_at == created.created_at
    assert client.conversations.retrieve(created.id).metadata == updated.metadata
    items = listed(client, created.id)
    assert texts(items) == ["hello", "hi!"]
    assert [(item.role, item.status, item.content[0].type) for item in items] == [
        ("user", "completed", "input_text"), ("assistant", "completed", "output_text")]
    deleted = client.conversations.delete(created.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (created.id, "conversation.deleted", True)
    for gone in (lambda: client.conversations.retrieve(created.id),
                 lambda: client.conversations.items.list(created.id),
                 lambda: client.conversations.delete(created.id)):
        with pytest.raises(openai.NotFoundError):
            gone()


def test_what_the_server_answers_is_what_the_sdks_types_declare(stack, client):
    created = httpx.post(f"{stack.base_url}/conversations", headers=stack.headers(), timeout=10,
                         json={"items": [said("typed"), {"type": "function_call", "call_id": "c1", "name": "f",
                                                         "arguments": "{}"},
                                         {"type": "function_call_output", "call_id": "c1", "output": "done"}]})
    assert created.status_code == 200
    conversation = Conversation.model_validate(created.json())
    url = f"{stack.base_url}/conversations/{conversation.id}"
    page = httpx.get(f"{url}/items", params={"order": "asc"}, headers=stack.headers(), timeout=10).json()
    parsed = ConversationItemList.model_validate(page)  # validated: every field each type requires
    assert [item.type for item in parsed.data] == ["message", "function_call", "function_call_output"]
    assert [item.id[:3] for item in parsed.data[:2]] == ["msg", "fc_"]
    assert parsed.first_id == parsed.data[0].id and parsed.last_id == parsed.data[-1].id and not parsed.has_more
    one = httpx.get(f"{url}/items/{parsed.data[1].id}", headers=stack.headers(), timeout=10).json()
    assert ITEM.validate_python(one) == parsed.data[1]
    gone = httpx.delete(url, headers=stack.headers(), timeout=10).json()
    assert ConversationDeletedResource.model_validate(gone).deleted


def test_items_are_added_paged_retrieved_and_deleted(client):
    conversation = client.conversations.create()
    assert listed(client, conversation.id) == []
    added = client.conversations.items.create(conversation.id, items=[
        {"role": "user", "content": f"message {n}"} for n in range(5)])
    assert added.object == "list" and not added.has_more
    assert texts(added.data) == [f"message {n}" for n in range(5)]
    assert (added.first_id, added.last_id) == (added.data[0].id, added.data[-1].id)
    ids = [item.id for item in added.data]
    assert len(set(ids)) == 5 and all(item_id.startswith("msg_") for item_id in ids)
    # OpenAI's defaults: newest first, 20 at a time.
    newest = client.conversations.items.list(conversation.id, limit=2)
    assert [item.id for item in newest.data] == [ids[4], ids[3]] and newest.has_more
    assert [item.id for item in client.conversations.items.list(conversation.id).data] == ids[::-1]
    after = client.conversations.items.list(conversation.id, after=ids[1], order="asc", limit=2)
    assert [item.id for item in after.data] == ids[2:4] and after.has_more
    assert [item.id for item in listed(client, conversation.id)] == ids  # the SDK follows last_id page by page
    assert client.conversations.items.retrieve(ids[2], conversation_id=conversation.id) == added.data[2]

    still = client.conversations.items.delete(ids[2], conversation_id=conversation.id)
    assert still == client.conversations.retrieve(conversation.id)  # OpenAI answers with the conversation
    assert [item.id for item in listed(client, conversation.id)] == ids[:2] + ids[3:]
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(ids[2], conversation_id=conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.delete(ids[2], conversation_id=conversation.id)
    with pytest.raises(openai.NotFoundError) as unknown_cursor:
        client.conversations.items.list(conversation.id, after=ids[2])
    assert unknown_cursor.value.param == "after"
    # An id is used once in a conversation: a deleted item's too.
    for again in (ids[0], ids[2]):
        with pytest.raises(openai.BadRequestError) as repeated:
            client.conversations.items.create(conversation.id, items=[{"id": again, **said("again")}])
        assert repeated.value.code == "item_already_in_conversation"
    kept = client.conversations.items.create(conversation.id, items=[{"id": "msg_mine", **said("my own id")}])
    assert kept.data[0].id == "msg_mine"


def test_items_are_checked_before_anything_is_stored(client):
    conversation = client.conversations.create(items=[said("first")])
    refused = [
        ([said("fine"), {"type": "message", "role": "user", "content": [{"type": "input_text"}]}],
         "items[1].content[0]"),
        ([{"type": "function_call_output", "call_id": "never-called", "output": "x"}], "items[0].call_id"),
        ([{"type": "message", "role": "wizard", "content": "x"}], "items[0].role"),
        ([said("a\x00b")], "items[0].content"),
        ([{"id": "not an id!", **said("x")}], "items[0].id"),
        ([said(str(n)) for n in range(21)], "items"),
        ([{"type": "item_reference", "id": "msg_nowhere"}], "items[0].id"),
    ]
    for items, param in refused:
        with pytest.raises(openai.BadRequestError) as bad:
            client.conversations.items.create(conversation.id, items=items)
        assert bad.value.param == param, bad.value.message
    with pytest.raises(openai.BadRequestError) as empty:
        client.conversations.items.create(conversation.id, items=[])
    assert empty.value.param == "items"
    assert texts(listed(client, conversation.id)) == ["first"]
    with pytest.raises(openai.BadRequestError) as too_many:
        client.conversations.create(items=[said(str(n)) for n in range(21)])
    assert too_many.value.param == "items"
    # An output may answer a call that is an earlier item of the conversation.
    client.conversations.items.create(conversation.id, items=[
        {"type": "function_call", "call_id": "call-1", "name": "look_up", "arguments": "{}"}])
    client.conversations.items.create(conversation.id, items=[
        {"type": "function_call_output", "call_id": "call-1", "output": "found"}])


@pytest.mark.parametrize(("metadata", "ok"), [
    ({f"k{i}": "v" for i in range(16)}, True), ({f"k{i}": "v" for i in range(17)}, False),
    ({"k" * 64: "v" * 512}, True), ({"k" * 65: "v"}, False), ({"k": "v" * 513}, False)])
def test_metadata_is_limited_as_openai_limits_it(client, metadata, ok):
    if ok:
        created = client.conversations.create(metadata=metadata)
        assert created.metadata == metadata
        assert client.conversations.update(created.id, metadata=None).metadata == {}
        return
    with pytest.raises(openai.BadRequestError) as refused:
        client.conversations.create(metadata=metadata)
    assert refused.value.param == "metadata"
    existing = client.conversations.create()
    with pytest.raises(openai.BadRequestError):
        client.conversations.update(existing.id, metadata=metadata)


def test_responses_take_the_conversation_as_history_and_are_appended_to_it(client):
    conversation = client.conversations.create(items=[said("Remember the word SAPPHIRE.")])
    first = client.responses.create(model=MODEL, input="first turn", conversation=conversation.id)
    assert first.status == "completed" and first.output_text == REPLY + "first turn"
    assert first.conversation.id == conversation.id
    assert client.responses.retrieve(first.id).conversation.id == conversation.id
    # The history is the conversation's items: the prompt is what sending them as input makes.
    seed = listed(client, conversation.id)[0]
    as_input = [seed.model_dump(exclude_none=True), said("first turn")]
    assert first.usage.input_tokens == client.responses.input_tokens.count(model=MODEL, input=as_input).input_tokens

    client.conversations.items.create(conversation.id, items=[said("An item between turns.")])
    second = client.responses.create(model=MODEL, input=[said("second turn")],
                                      conversation={"id": conversation.id})
    assert second.conversation.id == conversation.id and second.output_text == REPLY + "second turn"
    items = listed(client, conversation.id)
    assert [item.type for item in items] == ["message", "message", "reasoning", "message", "message", "message",
                                             "reasoning", "message"]
    assert texts(items) == ["Remember the word SAPPHIRE.", "first turn", REPLY + "first turn",
                            "An item between turns.", "second turn", REPLY + "second turn"]
    assert [item.id for item in items[2:4]] == [item.id for item in first.output]
    assert [item.id for item in items[6:]] == [item.id for item in second.output]
    # The response's own input is what it was sent, not its history.
    assert texts(client.responses.input_items.list(second.id).data) == ["second turn"]
    counted = client.responses.input_tokens.count(model=MODEL, input="third turn", conversation=conversation.id)
    as_input = [item.model_dump(exclude_none=True) for item in items] + [said("third turn")]
    assert counted.input_tokens == client.responses.input_tokens.count(model=MODEL, input=as_input).input_tokens

    # A deleted item is left out of later turns' history, an earlier output's included.
    client.conversations.items.delete(items[3].id, conversation_id=conversation.id)
    shorter = client.responses.input_tokens.count(model=MODEL, input="third turn", conversation=conversation.id)
    without = [item for index, item in enumerate(as_input) if index != 3]
    assert shorter.input_tokens == client.responses.input_tokens.count(model=MODEL, input=without).input_tokens
    assert shorter.input_tokens < counted.input_tokens


def test_a_streamed_turn_is_appended_too(client):
    conversation = client.conversations.create()
    with client.responses.stream(model=MODEL, input="streamed", conversation=conversation.id) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert events[0].response.conversation.id == conversation.id and final.conversation.id == conversation.id
    assert texts(listed(client, conversation.id)) == ["streamed", REPLY + "streamed"]


async def test_an_output_holding_a_nul_is_listed_retrieved_and_deleted(client, db):
    """A model may emit the byte 0; its response's output is stored as said (see
    test_parser_isolation), and the conversation's items are read past it."""
    conversation = client.conversations.create(items=[said("before")])
    turn = client.responses.create(model=MODEL, input="spoken", conversation=conversation.id)
    await db.execute("UPDATE responses SET snapshot = replace(snapshot::text, $2, $3)::json WHERE id = $1",
                     turn.id, REPLY, REPLY + "\\u0000")
    client.conversations.items.create(conversation.id, items=[said("after")])
    items = listed(client, conversation.id)
    assert texts(items) == ["before", "spoken", REPLY + "\x00spoken", "after"]
    message = items[-2]
    assert client.conversations.items.retrieve(message.id, conversation_id=conversation.id) == message
    newest = client.conversations.items.list(conversation.id, after=items[-1].id, limit=1)
    assert [item.id for item in newest.data] == [message.id] and newest.has_more
    # It is history to the next turn like any other output.
    following = client.responses.create(model=MODEL, input="next", conversation=conversation.id)
    assert following.status == "completed"
    client.conversations.items.delete(message.id, conversation_id=conversation.id)
    assert texts(listed(client, conversation.id)) == ["before", "spoken", "after", "next", REPLY + "next"]


def test_a_conversation_continues_on_another_replica(stack):
    first_replica = openai.OpenAI(base_url=stack.url_of(0), api_key=stack.keys["a"], max_retries=0)
    second_replica = openai.OpenAI(base_url=stack.url_of(1), api_key=stack.keys["a"], max_retries=0)
    conversation = first_replica.conversations.create(items=[said("made on one replica")])
    answered = second_replica.responses.create(model=MODEL, input="answered on the other", conversation=conversation.id)
    assert answered.output_text == REPLY + "answered on the other"
    assert texts(listed(first_replica, conversation.id)) == ["made on one replica", "answered on the other",
                                                             answered.output_text]


def test_refused_combinations_are_400s_in_openais_shape(stack, client):
    conversation = client.conversations.create()
    earlier = client.responses.create(model=MODEL, input="earlier")
    with pytest.raises(openai.BadRequestError) as both:
        client.responses.create(model=MODEL, input="x", conversation=conversation.id, previous_response_id=earlier.id)
    assert both.value.param == "conversation" and "previous_response_id" in both.value.message
    with pytest.raises(openai.BadRequestError) as unstored:
        client.responses.create(model=MODEL, input="x", conversation=conversation.id, store=False)
    assert unstored.value.param == "store"
    reply = httpx.post(f"{stack.base_url}/responses", headers=stack.headers(), timeout=10,
                       json={"model": MODEL, "input": "x", "conversation": {"name": conversation.id}})
    assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error"
    assert listed(client, conversation.id) == []  # nothing was appended


def every_use(client: openai.OpenAI, conversation_id: str, item_id: str) -> list[Any]:
    """Each thing a client can do with a conversation, as a call to make."""
    conversations = client.conversations
    return [
        lambda: conversations.retrieve(conversation_id),
        lambda: conversations.update(conversation_id, metadata={"owner": "b"}),
        lambda: conversations.items.list(conversation_id),
        lambda: conversations.items.retrieve(item_id, conversation_id=conversation_id),
        lambda: conversations.items.create(conversation_id, items=[said("intrusion")]),
        lambda: conversations.items.delete(item_id, conversation_id=conversation_id),
        lambda: conversations.delete(conversation_id),
        lambda: client.responses.create(model=MODEL, input="x", conversation=conversation_id),
    ]


def test_another_tenants_conversation_is_a_404_like_a_missing_one(client, other_tenant):
    mine = client.conversations.create(items=[said("private")], metadata={"owner": "a"})
    item_id = listed(client, mine.id)[0].id
    for conversation_id in (mine.id, "conv_" + "0" * 48, "not a conversation!"):
        for attempt in every_use(other_tenant, conversation_id, item_id):
            with pytest.raises(openai.NotFoundError) as missing:
                attempt()
            assert missing.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as via_response:
        other_tenant.responses.create(model=MODEL, input="x", conversation=mine.id)
    assert via_response.value.param == "conversation"
    assert client.conversations.retrieve(mine.id).metadata == {"owner": "a"}
    assert texts(listed(client, mine.id)) == ["private"]


def test_a_turn_while_the_previous_one_runs_is_a_409(client):
    conversation = client.conversations.create()
    running = client.responses.create(model=SLOW_MODEL, input="a long answer " * 5, conversation=conversation.id,
                                      background=True)
    with pytest.raises(openai.ConflictError) as busy:
        client.responses.create(model=MODEL, input="too soon", conversation=conversation.id)
    assert busy.value.status_code == 409 and busy.value.code == "conversation_busy"
    assert busy.value.param == "conversation" and running.id in busy.value.message
    # Items may still be added: they follow the running turn.
    client.conversations.items.create(conversation.id, items=[said("meanwhile")])
    assert texts(listed(client, conversation.id)) == ["a long answer " * 5, "meanwhile"]
    finished = wait_until_finished(client, running.id)
    after = client.responses.create(model=MODEL, input="now", conversation=conversation.id)
    assert after.output_text == REPLY + "now"
    assert texts(listed(client, conversation.id)) == ["a long answer " * 5, finished.output_text, "meanwhile", "now",
                                                      after.output_text]


def race(stack: Any, conversation_id: str) -> dict[str, Any]:
    """Two turns on the conversation at once, each from a replica of its own (so only
    the database can tell them apart): what each got."""
    start = threading.Barrier(2)
    outcomes: dict[str, Any] = {}

    def turn(name: str, replica: int) -> None:
        racer = openai.OpenAI(base_url=stack.url_of(replica), api_key=stack.keys["a"], max_retries=0)
        start.wait()
        try:
            outcomes[name] = racer.responses.create(model=SLOW_MODEL, input=f"racer {name}",
                                                    conversation=conversation_id, background=True)
        except openai.ConflictError as exc:
            outcomes[name] = exc

    racers = [threading.Thread(target=turn, args=(name, replica)) for replica, name in enumerate(("one", "two"))]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(60)
    return outcomes


def test_of_two_simultaneous_turns_one_is_taken_and_the_other_refused(stack, client):
    for attempt in range(3):
        conversation = client.conversations.create()
        outcomes = race(stack, conversation.id)
        taken = [name for name, outcome in outcomes.items() if not isinstance(outcome, Exception)]
        refused = [outcome for outcome in outcomes.values() if isinstance(outcome, openai.ConflictError)]
        assert len(taken) == 1 and len(refused) == 1, (attempt, outcomes)
        assert refused[0].code == "conversation_busy"
        winner = wait_until_finished(client, outcomes[taken[0]].id)
        assert texts(listed(client, conversation.id)) == [f"racer {taken[0]}", winner.output_text]


async def test_the_agents_sdk_keeps_an_agents_session_in_a_conversation(stack, monkeypatch):
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    import agents

    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0, timeout=30)
    asked: list[str] = []

    def look_up_order(order_id: str) -> str:
        """Look up where an order is."""
        asked.append(order_id)
        return f"order {order_id} shipped on Tuesday"

    clerk = agents.Agent(name="clerk", instructions="Answer questions about orders.",
                         model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
                         tools=[agents.function_tool(look_up_order)])
    session = agents.OpenAIConversationsSession(openai_client=client)
    run_config = agents.RunConfig(tracing_disabled=True)
    orders = ["A-1", "B-2", "C-3"]
    try:
        results = [await agents.Runner.run(clerk, order, session=session, run_config=run_config) for order in orders]
        assert asked == orders
        assert [result.final_output for result in results] == [
            f"{REPLY}the tool returned order {order} shipped on Tuesday" for order in orders]

        # Each turn is kept: the user's message, the call, its output and the answer.
        kept = await session.get_items()
        per_turn = ["message", "reasoning", "function_call", "function_call_output", "reasoning", "message"]
        assert [item["type"] for item in kept] == per_turn * len(orders)
        assert [item["content"][0]["text"] for item in kept[::6]] == orders
        calls = [item for item in kept if item["type"] == "function_call"]
        outputs = [item for item in kept if item["type"] == "function_call_output"]
        assert [call["call_id"] for call in calls] == [output["call_id"] for output in outputs]
        assert [output["output"] for output in outputs] == [f"order {order} shipped on Tuesday" for order in orders]
        listed_by_server = [item async for item in client.conversations.items.list(session.session_id, order="asc")]
        assert [item.id for item in listed_by_server] == [item["id"] for item in kept]

        # Every model call of a later turn was sent the earlier turns, read back from the conversation.
        last_turn_asked = results[-1].raw_responses[0].response_id
        sent = [item async for item in client.responses.input_items.list(last_turn_asked, order="asc", limit=100)]
        assert [item.type for item in sent] == per_turn * 2 + ["message"]
        assert [item.content[0].text for item in sent if item.type == "message" and item.role == "user"] == orders
        answer = await client.responses.retrieve(results[-1].raw_responses[-1].response_id)
        assert answer.output_text == results[-1].final_output

        popped = await session.pop_item()
        assert popped is not None and popped["id"] == kept[-1]["id"]
        assert [item["id"] for item in await session.get_items()] == [item["id"] for item in kept[:-1]]
        conversation_id = session.session_id
        await session.clear_session()
        with pytest.raises(openai.NotFoundError):
            await client.conversations.retrieve(conversation_id)
    finally:
        await client.close()


async def test_the_agents_sdk_runs_turns_in_a_conversation_the_server_keeps(stack, monkeypatch):
    """``Runner.run(..., conversation_id=...)``: the SDK sends each model call only its new
    items, naming the conversation, and the server holds the rest."""
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    import agents

    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0, timeout=30)

    def look_up_order(order_id: str) -> str:
        """Look up where an order is."""
        return f"order {order_id} shipped on Tuesday"

    clerk = agents.Agent(name="clerk", model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
                         tools=[agents.function_tool(look_up_order)])
    try:
        conversation = await client.conversations.create()
        for order in ("D-4", "E-5"):
            result = await agents.Runner.run(clerk, order, conversation_id=conversation.id,
                                             run_config=agents.RunConfig(tracing_disabled=True))
            assert result.final_output == f"{REPLY}the tool returned order {order} shipped on Tuesday"
            for response in result.raw_responses:
                assert (await client.responses.retrieve(response.response_id)).conversation.id == conversation.id
        kept = [item async for item in client.conversations.items.list(conversation.id, order="asc")]
        per_turn = ["message", "reasoning", "function_call", "function_call_output", "reasoning", "message"]
        assert [item.type for item in kept] == per_turn * 2
        assert [item.content[0].text for item in kept[::6]] == ["D-4", "E-5"]
    finally:
        await client.close()
