"""The services' logs as a log pipeline reads them (STENO_LOG_FORMAT=json): every line a
JSON object, the lines about a response carrying it, and none of its text."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest

from steno.infra.processes import Stack
from tests.conftest import separate_stack

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"
PROMPT = "Describe the lighthouse keeper's marmalade"
WAIT_S = 30.0


@pytest.fixture
def json_stack(settings, tmp_path) -> Iterator[Stack]:
    logged = settings.with_changes(log_format="json", log_level="INFO", log_content=False, model_wait_s=10.0)
    with separate_stack(logged, "jsonlogs", tmp_path) as stack:
        stack.add("parser", "parser")
        stack.add("worker", "worker", "--sim-tokens-per-s", "0")
        stack.add_api()
        yield stack


def log_lines(stack: Stack) -> list[str]:
    return [line for process in stack.processes for line in process.log_text().splitlines()]


def lines_about(stack: Stack, response_id: str, message: str) -> list[dict[str, Any]]:
    """The lines about the response, once one of them says ``message``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        about = [parsed for parsed in map(orjson.loads, log_lines(stack)) if parsed.get("response_id") == response_id]
        if any(line["message"] == message for line in about):
            return about
        assert time.monotonic() < deadline, f"no {message!r} line for {response_id}:\n{stack.logs()}"
        time.sleep(0.2)


def test_json_lines_name_the_response_and_never_its_text(json_stack: Stack) -> None:
    sdk = openai.OpenAI(base_url=json_stack.base_url, api_key=json_stack.keys["a"], max_retries=0, timeout=60)
    response = sdk.responses.create(model=MODEL, input=PROMPT)
    assert response.status == "completed"

    about = lines_about(json_stack, response.id, "response finished")
    lines = log_lines(json_stack)
    parsed = [orjson.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "service", "logger", "message"} <= line.keys() for line in parsed)
    assert {line["service"] for line in parsed} >= {"api", "worker", "parser"}
    for line in about:
        assert (line["tenant"], line["model"]) == ("a", MODEL), line
        assert line["attempt"] == 0, line
    accepted = [line for line in about if line["message"] == "response accepted"]
    finished = [line for line in about if line["message"] == "response finished"]
    assert [(line["service"], line["level"], line["stream"], line["background"]) for line in accepted] == [
        ("api", "INFO", False, False)]
    assert [(line["service"], line["level"], line["status"], line["output_tokens"]) for line in finished] == [
        ("parser", "INFO", "completed", response.usage.output_tokens)]
    assert finished[0]["duration_s"] >= 0
    assert not [line for line in lines if "marmalade" in line or response.output_text in line]
