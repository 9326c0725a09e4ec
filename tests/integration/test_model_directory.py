"""Which models are served, and in which dialect, as the API reads it from the workers'
registrations."""

import asyncio

import nats
import openai
import pytest

from steno.schemas.bus import WorkerRegistration
from steno.services.common.bus import Names, model_token, worker_registry

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"


async def _registry(settings):
    nc = await nats.connect(settings.nats_url)
    return nc, await worker_registry(nc.jetstream(), Names.from_settings(settings))


async def test_a_worker_registers_its_model_engine_and_dialect(stack, settings):
    nc, registry = await _registry(settings)
    try:
        value = (await registry.get(model_token(MODEL))).value
    finally:
        await nc.close()
    registration = WorkerRegistration.model_validate_json(value)
    assert (registration.model, registration.engine, registration.dialect) == (MODEL, "simulator", "harmony")


async def _register(settings, model: str, registration: WorkerRegistration) -> None:
    nc, registry = await _registry(settings)
    try:
        await registry.put(model_token(model), registration.model_dump_json().encode())
    finally:
        await nc.close()


async def test_a_model_in_a_dialect_this_api_cannot_render_is_a_clear_503_and_records_nothing(
        stack, settings, client, db):
    model = "steno-unknown-dialect"
    await _register(settings, model,
                    WorkerRegistration(model=model, engine="vllm", dialect="klingon", context_tokens=4096))
    with pytest.raises(openai.InternalServerError) as refused:
        await asyncio.to_thread(client.responses.create, model=model, input="qapla")
    assert refused.value.status_code == 503
    assert model in refused.value.message and "dialect" in refused.value.message
    assert await db.fetchval("SELECT count(*) FROM responses WHERE model = $1", model) == 0


async def test_names_that_differ_only_in_punctuation_are_different_models(stack, settings, client):
    assert model_token("vendor/tiny") != model_token("vendor_tiny")
    await _register(settings, "vendor/tiny",
                    WorkerRegistration(model="vendor/tiny", engine="vllm", dialect="harmony", context_tokens=4096))
    with pytest.raises(openai.NotFoundError) as refused:
        await asyncio.to_thread(client.responses.create, model="vendor_tiny", input="x")
    assert refused.value.code == "model_not_found"
