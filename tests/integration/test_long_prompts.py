"""A prompt the model accepts reaches its worker whatever its size: larger than a bus
message, the generation request goes through the request store."""

import asyncio
import time

import nats
import pytest
from nats.js.errors import NotFoundError

from steno.services.common.bus import Names, request_store
from tests.conftest import LONG_MODEL

pytestmark = pytest.mark.integration


async def stored_requests(settings) -> list[str]:
    nc = await nats.connect(settings.nats_url)
    try:
        store = await request_store(nc.jetstream(), Names.from_settings(settings))
        return [info.name for info in await store.list(ignore_deletes=True)]
    except NotFoundError:  # what an empty store answers
        return []
    finally:
        await nc.close()


def test_a_prompt_larger_than_a_bus_message_is_generated_and_leaves_no_stored_request(stack, settings, client):
    streamed = []
    with client.responses.stream(model=LONG_MODEL, input="Remember" + " hello" * 200_000) as stream:
        for event in stream:
            streamed.append(event.type)
        final = stream.get_final_response()
    assert final.status == "completed", final
    assert final.output_text.startswith("Steno simulator reply: Remember hello hello")
    assert final.usage.input_tokens > 200_000  # more token ids than one bus message holds
    assert streamed[0] == "response.created" and streamed[-1] == "response.completed"
    assert client.responses.retrieve(final.id).output_text == final.output_text
    for _ in range(50):  # the worker removes it once it has acked the work
        if asyncio.run(stored_requests(settings)) == []:
            break
        time.sleep(0.1)
    assert asyncio.run(stored_requests(settings)) == []
