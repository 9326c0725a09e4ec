"""Responses whose token streams a test publishes itself, as a worker would: for what
no engine here emits (arbitrary text, refused writes)."""

import asyncio
import secrets

import nats

from steno.schemas.api import CreateResponseRequest
from steno.schemas.bus import GenerationEnded, GroupedBatch, TokenBatch, TokenBatchGroup
from steno.services.api.response_plan import plan_response
from steno.services.api.store import ResponseStore
from steno.services.common.bus import Names, partition_of
from steno.services.dialects import CompletionMessage, dialect_named

MODEL = "steno-simulator"


def neighbours(settings, count: int) -> list[str]:
    """Response ids that share one token partition (so one parser fetch holds them all)."""
    ids: list[str] = []
    while len(ids) < count:
        rid = f"resp_iso{secrets.token_hex(12)}"
        if not ids or partition_of(rid, settings.token_partitions) == partition_of(ids[0], settings.token_partitions):
            ids.append(rid)
    return ids


async def create(pool, rid: str, text: str, tenant: str = "a", model: str = MODEL) -> None:
    """Records a response as the API would, without queueing its generation. Tenant "a"
    is the client fixture's, which reads it back through the API."""
    request = CreateResponseRequest(model=model, input=text, background=True)
    plan = plan_response(request, rid, tenant, 1_700_000_000, dialect_named("harmony").render(request, 1_700_000_000))
    await ResponseStore(pool).create(plan.record, plan.first_events)


def stream_of(rid: str, text: str, attempt: int = 0) -> list[TokenBatch]:
    tokens = dialect_named("harmony").write_completion([CompletionMessage("final", text)])
    batches = [TokenBatch(response_id=rid, attempt=attempt, batch_no=n, token_ids=tokens[start:start + 4])
               for n, start in enumerate(range(0, len(tokens), 4))]
    batches[-1].ended = GenerationEnded(response_id=rid, attempt=attempt, batch_count=len(batches),
                                        finish_reason="stop", prompt_tokens=10, output_tokens=len(tokens))
    return batches


async def publish_interleaved(settings, streams: list[list[TokenBatch]]) -> None:
    names = Names.from_settings(settings)
    nc = await nats.connect(settings.nats_url.split(","))
    try:
        js = nc.jetstream()
        longest = max(len(stream) for stream in streams)
        for n in range(longest):
            for stream in streams:
                if n < len(stream):
                    await js.publish(names.tokens_subject(stream[n].response_id), stream[n].model_dump_json().encode())
    finally:
        await nc.close()


async def statuses(db, ids: list[str], wanted: int) -> dict[str, str]:
    for _ in range(200):
        rows = {r[0]: r[1] for r in await db.fetch("SELECT id, status FROM responses WHERE id = ANY($1)", ids)}
        if sum(status in ("completed", "failed") for status in rows.values()) >= wanted:
            return rows
        await asyncio.sleep(0.1)
    return rows


async def publish_grouped(settings, streams: list[list[TokenBatch]], skip: set[tuple[str, int]] = frozenset()
                          ) -> None:
    """Publishes the streams' n-th batches together, one ``TokenBatchGroup`` per step, as a
    worker does for responses of one partition stepping together; the batches in
    ``skip`` (response id, batch number) are left out."""
    names = Names.from_settings(settings)
    partition = partition_of(streams[0][0].response_id, settings.token_partitions)
    nc = await nats.connect(settings.nats_url.split(","))
    try:
        js = nc.jetstream()
        for n in range(max(len(stream) for stream in streams)):
            group = TokenBatchGroup(batches=[GroupedBatch(batch=stream[n]) for stream in streams
                                             if n < len(stream) and (stream[n].response_id, n) not in skip])
            await js.publish(names.tokens_group_subject(partition), group.model_dump_json().encode())
    finally:
        await nc.close()


async def publish_alone(settings, batch: TokenBatch) -> None:
    """Publishes one batch on its response's own subject."""
    names = Names.from_settings(settings)
    nc = await nats.connect(settings.nats_url.split(","))
    try:
        await nc.jetstream().publish(names.tokens_subject(batch.response_id), batch.model_dump_json().encode())
    finally:
        await nc.close()
