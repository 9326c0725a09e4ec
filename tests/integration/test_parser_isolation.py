"""One response's output cannot stall another's: whatever a model emits is stored, and a
write Postgres refuses fails only its own response, visibly."""

import asyncpg
import openai
import orjson
import pytest

from tests.events_oracle import validate_events
from tests.token_streams import create, neighbours, publish_interleaved, statuses, stream_of

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"


async def test_output_with_nul_is_stored_and_streamed_and_its_neighbour_completes(stack, settings, client, db):
    poisoned, neighbour = neighbours(settings, 2)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    try:
        await create(pool, poisoned, "nul")
        await create(pool, neighbour, "plain")
    finally:
        await pool.close()
    await publish_interleaved(settings, [stream_of(poisoned, "before\x00after"), stream_of(neighbour, "fine")])
    assert await statuses(db, [poisoned, neighbour], 2) == {poisoned: "completed", neighbour: "completed"}
    assert client.responses.retrieve(poisoned).output_text == "before\x00after"
    assert client.responses.retrieve(neighbour).output_text == "fine"
    with client.responses.stream(response_id=poisoned) as replay:
        events = list(replay)
    assert events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "before\x00after"
    # Looking up the tenant's stored items reads past it; referencing it is refused as a
    # NUL sent in the input is, with a 400 naming the field.
    with pytest.raises(openai.BadRequestError, match="not found"):
        client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": "msg_unknown"}])
    [message] = client.responses.retrieve(poisoned).output
    with pytest.raises(openai.BadRequestError, match="NUL"):
        client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": message.id}])


async def test_a_write_postgres_refuses_fails_its_response_alone(stack, settings, client, db):
    """Here the refused write is a batch of an attempt numbered beyond Postgres's integer
    column: the parser applies it, the commit of its partition fails, and the parser
    commits every response of the partition on its own, failing the refused one."""
    ids = neighbours(settings, 3)
    refused, neighbours_of = ids[0], ids[1:]
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    try:
        for rid in ids:
            await create(pool, rid, rid)
    finally:
        await pool.close()
    await publish_interleaved(settings, [stream_of(refused, "never stored", attempt=2**40),
                                         *(stream_of(rid, f"fine {rid[-4:]}") for rid in neighbours_of)])
    final = await statuses(db, ids, len(ids))
    assert final == {refused: "failed", **dict.fromkeys(neighbours_of, "completed")}
    failed = client.responses.retrieve(refused)
    assert failed.status == "failed" and failed.error.code == "server_error"
    rows = await db.fetch("SELECT payload FROM response_events WHERE response_id = $1 ORDER BY seq", refused)
    payloads = [row[0] for row in rows]
    types = [event.type for event in validate_events(payloads)]
    assert types[-2:] == ["error", "response.failed"]
    assert [orjson.loads(p)["sequence_number"] for p in payloads] == list(range(len(payloads)))
    for rid in neighbours_of:
        assert client.responses.retrieve(rid).output_text == f"fine {rid[-4:]}"
    with pytest.raises(openai.BadRequestError):  # and it stays failed: nothing can cancel it
        client.responses.cancel(refused)
