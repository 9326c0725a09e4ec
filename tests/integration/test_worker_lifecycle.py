"""A worker told to stop hands its unfinished work back; another worker continues it."""

import signal
import time

import openai
import pytest

from steno.infra.processes import Stack, remove_namespace
from tests.conftest import started_in_background

pytestmark = pytest.mark.integration

MODEL = "steno-handover"


def test_sigterm_drains_then_hands_back_and_another_worker_continues(settings, tmp_path):
    stack = Stack(settings.with_changes(namespace=settings.namespace + "handover"), tmp_path)
    stack.create_key("a")
    try:
        stack.add("parser", "parser")
        first = stack.add("worker-1", "worker", "--model", MODEL, "--sim-tokens-per-s", "15", "--drain-timeout", "1")
        stack.add_api()
        client = openai.OpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0)
        prompt = "hand this over " * 8
        created = started_in_background(client, MODEL, prompt)

        started = time.monotonic()
        assert first.stop(signal.SIGTERM, timeout_s=15) == 0
        assert time.monotonic() - started < 5  # the drain timeout, not the whole generation
        assert client.responses.retrieve(created.id).status == "in_progress"

        stack.add("worker-2", "worker", "--model", MODEL, "--sim-tokens-per-s", "200")
        with client.responses.stream(response_id=created.id) as stream:
            events = list(stream)
        final = client.responses.retrieve(created.id)
        assert final.status == "completed"
        # Continued, not started again: the answer is said once, and the stream has no gaps.
        assert final.output_text == "Steno simulator reply: " + " ".join(prompt.split())
        assert [e.sequence_number for e in events] == list(range(len(events)))
    finally:
        stack.stop()
        remove_namespace(stack.settings)
