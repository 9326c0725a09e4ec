"""A 50-turn previous_response_id chain survives a restart of every Steno process."""

import itertools

import openai
import pytest

from steno.infra.processes import Stack, remove_namespace

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"


def start(stack: Stack) -> None:
    stack.add("parser", "parser")
    stack.add("worker", "worker", "--sim-tokens-per-s", "0")
    stack.add_api()


def test_fifty_turns_across_a_restart(settings, tmp_path):
    # A namespace of its own, so no other worker of the session serves these turns.
    stack = Stack(settings.with_changes(namespace=settings.namespace + "chain"), tmp_path)
    stack.create_key("chain")
    usage, previous = [], None
    try:
        start(stack)
        for turn in range(50):
            if turn == 25:
                stack.stop()
                stack.processes.clear()
                stack.api_ports.clear()
                start(stack)
            client = openai.OpenAI(base_url=stack.base_url, api_key=stack.keys["chain"], max_retries=0)
            response = client.responses.create(model=MODEL, input=f"turn {turn}", previous_response_id=previous)
            assert response.status == "completed", response.error
            assert response.output_text == f"Steno simulator reply: turn {turn}"
            usage.append(response.usage.input_tokens)
            previous = response.id
    finally:
        stack.stop()
        remove_namespace(stack.settings)
    # Every turn's prompt holds every earlier turn.
    assert all(later > earlier for earlier, later in itertools.pairwise(usage))
    first_turn_cost = usage[1] - usage[0]
    assert usage[-1] >= usage[0] + 49 * (first_turn_cost // 2)
