import typing

import pytest
from openai.types.responses import Response, response_create_params
from pydantic import ValidationError

from steno.schemas.api import CountInputTokensRequest, CreateResponseRequest
from steno.services.api.response_plan import base_snapshot

SDK_FIELDS = set(typing.get_type_hints(response_create_params.ResponseCreateParamsBase, include_extras=False,
                                       localns={"ClassVar": typing.ClassVar}))
# Steno's own, beside the SDK's: what clients send without the SDK's types saying so.
OWN_FIELDS = {"stream", "client_metadata", "seed"}


def test_every_field_the_sdk_declares_is_accepted_and_nothing_else():
    assert set(CreateResponseRequest.model_fields) == SDK_FIELDS | OWN_FIELDS
    with pytest.raises(ValidationError) as refused:
        CreateResponseRequest.model_validate({"model": "m", "input": "x", "temperture": 1})
    assert refused.value.errors()[0]["type"] == "extra_forbidden"


def test_nulls_are_the_defaults():
    request = CreateResponseRequest.model_validate({
        "model": "m", "input": "x", "store": None, "background": None, "parallel_tool_calls": None,
        "truncation": None, "tool_choice": None, "tools": None, "reasoning": {"effort": None, "summary": None}})
    assert (request.store, request.background, request.parallel_tool_calls) == (True, False, True)
    assert (request.truncation, request.tool_choice, request.tools) == ("disabled", "auto", [])


@pytest.mark.parametrize("effort", ["none", "minimal", "low", "medium", "high", "xhigh", "max"])
def test_every_reasoning_effort_the_sdk_allows_is_accepted(effort):
    request = CreateResponseRequest(model="m", input="x", reasoning={"effort": effort, "context": "all_turns"})
    assert request.reasoning is not None and request.reasoning.effort == effort


def test_what_codex_sends_is_accepted():
    CreateResponseRequest.model_validate({
        "model": "m", "input": "x", "client_metadata": {"x-codex-turn": 1}, "prompt_cache_key": "k",
        "reasoning": {"effort": "xhigh", "summary": "auto"}, "include": ["reasoning.encrypted_content"],
        "store": False, "stream": True, "parallel_tool_calls": False, "text": {"verbosity": "low"}})


def test_the_created_response_has_every_field_of_the_sdks_response():
    snapshot = base_snapshot(CreateResponseRequest(model="m", input="x"), "resp_x", 1, "queued")
    assert set(Response.model_fields) <= set(snapshot)
    parsed = Response.model_validate(snapshot)
    assert (parsed.top_logprobs, parsed.service_tier, parsed.completed_at, parsed.truncation) == (0, "default", None,
                                                                                                 "disabled")


def test_a_count_request_is_the_prompt_of_a_response_request():
    body = CountInputTokensRequest(model="m", input="hi", instructions="Be brief.", personality="friendly")
    request = body.as_request()
    assert (request.model, request.input, request.instructions) == ("m", "hi", "Be brief.")
