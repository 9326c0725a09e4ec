"""A live worker keeps the requests it holds for as long as it generates them: its
heartbeats hold off redelivery however many ack waits a generation lasts, so another
worker never takes a live one's request over."""

import asyncio
import time

import asyncpg
import openai
import pytest

from steno.infra.processes import Stack, remove_namespace
from steno.services.common.in_progress import ACK_WAIT_S

pytestmark = pytest.mark.integration

MODEL = "steno-liveness"


async def attempts_stored(database_url: str, response_id: str) -> list[int]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT DISTINCT attempt FROM response_tokens WHERE response_id = $1 ORDER BY 1",
                                response_id)
        return [row[0] for row in rows]
    finally:
        await conn.close()


def test_a_generation_lasting_several_ack_waits_stays_with_its_worker(settings, tmp_path):
    stack = Stack(settings.with_changes(namespace=settings.namespace + "liveness"), tmp_path)
    stack.create_key("a")
    try:
        stack.add("parser", "parser")
        # Two workers: a request redelivered would go on at either.
        for name in ("worker-1", "worker-2"):
            stack.add(name, "worker", "--model", MODEL, "--sim-tokens-per-s", "8")
        stack.add_api()
        client = openai.OpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0)
        prompt = "keep this one " * 12
        started = time.monotonic()
        with client.responses.stream(model=MODEL, input=prompt) as stream:
            events = list(stream)
        # The generation outlasted the ack wait several times over (what this test is about).
        assert time.monotonic() - started > 3 * ACK_WAIT_S
        final = events[-1].response
        assert final.status == "completed"
        assert final.output_text == "Steno simulator reply: " + " ".join(prompt.split())
        assert [e.sequence_number for e in events] == list(range(len(events)))
        # One attempt only: no other worker took it up meanwhile.
        assert asyncio.run(attempts_stored(stack.settings.database_url, final.id)) == [0]
    finally:
        stack.stop()
        remove_namespace(stack.settings)
