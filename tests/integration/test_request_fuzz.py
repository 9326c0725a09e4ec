"""Requests built to confuse: every field of the request and of its input items and
tools given values of the wrong type, odd unicode, and nesting. Whatever comes, the
API answers 2xx or 4xx in OpenAI's shape, never 5xx (property-based, against the real
stack; schemathesis covers the OpenAPI document's own shapes in test_openapi_fuzz)."""

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"

odd_text = st.text(alphabet=st.characters() | st.characters(categories=["Cs"]) | st.sampled_from(
    ["\x00", "\u2028", "\x85", "\ufeff", "\U0001f389", "é"]), max_size=20) | st.sampled_from(
    ["<|start|>", "<|call|>", "<|channel|>final<|message|>"])
# Values that have broken servers like this one: drawn often, not left to chance.
nasty = st.sampled_from([2**64, -(2**63) - 1, 2**63, "\x00", "a\x00b", "\ud800", [], {}, 0, -1, 7, True, None,
                         "x" * 300, [[[[[[[[]]]]]]]], {"type": 7}])
scalars = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(
    allow_nan=False, allow_infinity=False) | odd_text
anything = nasty | st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    odd_text, inner, max_size=3), max_leaves=8)
ITEM_TYPES = ["message", "reasoning", "function_call", "function_call_output", "custom_tool_call",
              "custom_tool_call_output", "code_interpreter_call", "web_search_call", "mcp_call", "item_reference"]
ITEM_KEYS = ["type", "role", "content", "id", "call_id", "name", "namespace", "arguments", "output", "input", "code",
             "action", "server_label", "summary", "phase", "status"]
TOOL_TYPES = ["function", "custom", "namespace", "web_search", "code_interpreter", "mcp"]
TOOL_KEYS = ["type", "name", "description", "parameters", "format", "tools", "strict"]


def shaped(keys: list[str], types: list[str]) -> st.SearchStrategy[dict]:
    """Objects with the right keys (and mostly a known type) but any values."""
    return st.fixed_dictionaries({"type": st.sampled_from(types) | anything},
                                 optional={key: anything | odd_text for key in keys if key != "type"})


items = shaped(ITEM_KEYS, ITEM_TYPES) | st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "developer"]) | anything,
     "content": odd_text | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text"])
                                                                   | anything, "text": odd_text | anything}))})
tools = shaped(TOOL_KEYS, TOOL_TYPES)
bodies = st.fixed_dictionaries(
    {"model": st.just(MODEL) | anything, "input": odd_text | st.lists(items, max_size=4) | anything},
    optional={
        "instructions": odd_text | anything,
        "tools": st.lists(tools, max_size=3) | anything,
        "tool_choice": st.sampled_from(["auto", "none", "required"]) | shaped(["name", "namespace", "tools", "mode"],
                                                                             ["function", "allowed_tools"]) | anything,
        "text": st.fixed_dictionaries({"format": shaped(["name", "schema", "strict"],
                                                        ["json_schema", "json_object", "text"])}) | anything,
        "max_output_tokens": nasty | st.integers(min_value=-5, max_value=2**66) | anything,
        "metadata": st.dictionaries(odd_text, odd_text, max_size=3) | anything,
        "previous_response_id": nasty | odd_text,
        "include": st.lists(odd_text) | anything,
        "top_logprobs": anything,
        "seed": nasty | st.integers(min_value=-(2**66), max_value=2**66),
    },
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(body=bodies)
def test_no_confusing_request_gets_a_5xx(stack, body):
    # The standard library encodes what orjson refuses (integers beyond 64 bits); escapes
    # stay escapes, so unpaired surrogates reach the server as written.
    reply = httpx.post(f"{stack.base_url}/responses", content=json.dumps({**body, "background": True}).encode(),
                       headers={"content-type": "application/json", **stack.headers()}, timeout=60)
    assert reply.status_code < 500, (reply.status_code, reply.text[:500], body)
    if reply.status_code >= 400:
        error = reply.json()["error"]
        assert error["message"] and error["type"] == "invalid_request_error", error
