"""Retention: when stored responses and conversations expire (migration 0010), and the
sweep that deletes them with everything they had, through the real stack and the real
``steno retention`` command."""

import subprocess
import sys
import threading
import uuid

import openai
import pytest

from steno.infra.processes import service_env

pytestmark = pytest.mark.integration

TENANT = "retention-tenant"


@pytest.fixture(scope="module")
def retention_client(stack):
    key = stack.create_key(TENANT)
    return openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0, timeout=60)


def steno(stack, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "steno.services.cli", *argv], env=service_env(stack.settings),
                          capture_output=True, text=True, check=False)


@pytest.fixture
def tenant_policy(stack):
    """Sets the test tenant's policy; cleared afterwards."""
    def set_days(days: int) -> None:
        done = steno(stack, "retention", "set", "--tenant", TENANT, "--days", str(days))
        assert done.returncode == 0, done.stderr
    yield set_days
    steno(stack, "retention", "clear", "--tenant", TENANT)


async def kept_days(db, response_id: str) -> float | None:
    return await db.fetchval("SELECT extract(epoch FROM expires_at - created_at) / 86400 FROM responses "
                             "WHERE id = $1", response_id)


async def leftovers(db, response_id: str) -> dict[str, int]:
    """Rows anywhere that still belong to the response."""
    counts = {}
    for table, column in (("responses", "id"), ("response_events", "response_id"),
                          ("response_event_chunks", "response_id"),
                          ("response_tokens", "response_id"), ("response_input_items", "response_id"),
                          ("response_output_items", "response_id")):
        counts[table] = await db.fetchval(f"SELECT count(*) FROM {table} WHERE {column} = $1", response_id)
    return {table: count for table, count in counts.items() if count}


async def age(db, response_id: str, days: int) -> None:
    """As if the response had been created ``days`` earlier, expiry included."""
    await db.execute("UPDATE responses SET created_at = created_at - make_interval(days => $2), "
                     "expires_at = expires_at - make_interval(days => $2) WHERE id = $1", response_id, days)


async def test_without_a_policy_a_stored_response_is_kept(retention_client, db):
    kept = retention_client.responses.create(model="steno-simulator", input="keep me")
    assert await kept_days(db, kept.id) is None


async def test_a_response_expires_after_its_tenants_policy_and_goes_with_all_it_had(retention_client, tenant_policy,
                                                                                     stack, db):
    tenant_policy(2)
    doomed = retention_client.responses.create(model="steno-simulator", input="short-lived")
    assert doomed.status == "completed"
    assert await kept_days(db, doomed.id) == pytest.approx(2)
    assert await leftovers(db, doomed.id)  # events, tokens, items: all there

    await age(db, doomed.id, 3)
    done = steno(stack, "retention", "sweep")
    assert done.returncode == 0 and "expired responses" in done.stdout
    assert await leftovers(db, doomed.id) == {}
    with pytest.raises(openai.NotFoundError):
        retention_client.responses.retrieve(doomed.id)


async def test_a_responses_metadata_sets_its_own_retention_and_a_bad_value_is_a_400(retention_client,
                                                                                   tenant_policy, db):
    tenant_policy(30)
    own = retention_client.responses.create(model="steno-simulator", input="mine",
                                            metadata={"steno_retention_days": "3"})
    assert await kept_days(db, own.id) == pytest.approx(3)
    with pytest.raises(openai.BadRequestError) as refused:
        retention_client.responses.create(model="steno-simulator", input="x", metadata={"steno_retention_days": "0"})
    assert "steno_retention_days" in str(refused.value)


async def test_the_default_policy_applies_to_tenants_without_their_own(db):
    # Inside a transaction that is rolled back: other tests' tenants never see the policy.
    transaction = db.transaction()
    await transaction.start()
    try:
        await db.execute("INSERT INTO retention_policies (tenant_id, days) VALUES ('*', 7), ('somebody', 9)")
        assert await db.fetchval("SELECT steno_retention_days('nobody', '{}'::json)") == 7
        assert await db.fetchval("SELECT steno_retention_days('somebody', '{}'::json)") == 9
        assert await db.fetchval(
            """SELECT steno_retention_days('somebody', '{"steno_retention_days": "2"}'::json)""") == 2
    finally:
        await transaction.rollback()


async def test_a_conversations_responses_live_as_long_as_it_and_then_by_their_own_retention(
        retention_client, tenant_policy, stack, db):
    tenant_policy(5)
    conversation = retention_client.conversations.create()
    first = retention_client.responses.create(model="steno-simulator", input="turn one",
                                              conversation=conversation.id)
    assert await kept_days(db, first.id) is None  # it goes with the conversation
    last_activity = await db.fetchval("SELECT created_at FROM responses WHERE id = $1", first.id)
    expires = await db.fetchval("SELECT expires_at FROM conversations WHERE id = $1", conversation.id)
    assert (expires - last_activity).days == 5

    retention_client.conversations.delete(conversation.id)
    assert await kept_days(db, first.id) == pytest.approx(5)  # now its own retention

    await age(db, first.id, 6)
    steno(stack, "retention", "sweep")
    assert await leftovers(db, first.id) == {}


async def test_an_expired_conversation_is_swept_with_its_items(retention_client, tenant_policy, stack, db):
    tenant_policy(1)
    conversation = retention_client.conversations.create(items=[{"role": "user", "content": "hello"}])
    turn = retention_client.responses.create(model="steno-simulator", input="hi", conversation=conversation.id)
    await db.execute("UPDATE conversations SET expires_at = now() - interval '1 second' WHERE id = $1",
                     conversation.id)
    await age(db, turn.id, 2)
    steno(stack, "retention", "sweep")  # the conversation, then its response at its own retention
    steno(stack, "retention", "sweep")
    assert await db.fetchval("SELECT count(*) FROM conversations WHERE id = $1", conversation.id) == 0
    assert await db.fetchval("SELECT count(*) FROM conversation_entries WHERE conversation_id = $1",
                             conversation.id) == 0
    assert await leftovers(db, turn.id) == {}


async def test_the_sweep_removes_exactly_the_expired_rows_while_responses_are_being_made(retention_client, stack, db):
    marker = uuid.uuid4().hex
    # Expired rows, each with events: more than one batch of them.
    await db.execute("""
        INSERT INTO responses (id, tenant_id, model, status, background, store, request, parse_context,
                               base_snapshot, created_at, expires_at)
        SELECT 'resp_sweep' || $1 || n, $2, 'm', 'completed', false, true, '{}', '{}', '{}',
               now() - interval '2 days', now() - interval '1 day'
        FROM generate_series(1, 1200) AS n""", marker, TENANT)
    await db.execute("""
        INSERT INTO response_events (response_id, seq, type, payload)
        SELECT 'resp_sweep' || $1 || n, seq, 'response.in_progress', '{}'
        FROM generate_series(1, 1200) AS n, generate_series(0, 4) AS seq""", marker)
    made: list[str] = []

    def keep_making() -> None:
        for index in range(12):
            made.append(retention_client.responses.create(model="steno-simulator", input=f"alive {index}").id)

    maker = threading.Thread(target=keep_making)
    maker.start()
    done = steno(stack, "retention", "sweep")
    maker.join()
    assert done.returncode == 0, done.stderr
    assert await db.fetchval("SELECT count(*) FROM responses WHERE id LIKE 'resp_sweep' || $1 || '%'", marker) == 0
    assert await db.fetchval("SELECT count(*) FROM response_events WHERE response_id LIKE 'resp_sweep' || $1 || '%'",
                             marker) == 0
    assert len(made) == 12
    for response_id in made:
        assert retention_client.responses.retrieve(response_id).status == "completed"
