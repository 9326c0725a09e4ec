import pytest
from pydantic import ValidationError

from steno.schemas.api import CreateResponseRequest
from steno.services.api.errors import ApiError
from steno.services.api.limits import MAX_DEPTH, check_request


def refused(**body) -> ApiError:
    with pytest.raises(ApiError) as error:
        check_request(CreateResponseRequest(model="m", **body))
    assert error.value.status == 400
    return error.value


def nested(levels: int) -> dict:
    value: dict = {"type": "object"}
    for _ in range(levels):
        value = {"type": "object", "properties": {"x": value}}
    return value


def test_an_ordinary_request_passes():
    check_request(CreateResponseRequest(model="m", input=[{"role": "user", "content": "héllo 日本"}],
                                        tools=[{"type": "function", "name": "f", "parameters": nested(10)}],
                                        metadata={"k": "v"}, max_output_tokens=100, seed=2**63 - 1))


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "a\x00b"}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x\x00"}]}]}, "input[0].content[0].text"),
    ({"input": "x", "instructions": "\x00"}, "instructions"),
    ({"input": "x", "metadata": {"k": "v\x00"}}, "metadata.k"),
    ({"input": "x", "tools": [{"type": "function", "name": "f", "description": "\x00"}]}, "tools[0].description"),
])
def test_nul_anywhere_is_refused_naming_the_field(body, param):
    assert refused(**body).param == param


def test_an_unpaired_surrogate_is_refused():
    assert refused(input=[{"role": "user", "content": "a\ud800"}]).param == "input[0].content"


def test_nesting_beyond_the_limit_is_refused_and_within_it_passes():
    check_request(CreateResponseRequest(model="m", input="x", text={"format": {
        "type": "json_schema", "name": "n", "schema": nested(MAX_DEPTH // 2 - 4)}}))
    error = refused(input="x", text={"format": {"type": "json_schema", "name": "n", "schema": nested(MAX_DEPTH)}})
    assert error.param.startswith("text.format.schema.properties.x")


def test_integers_beyond_64_bits_are_refused_in_free_form_fields():
    tools = [{"type": "function", "name": "f", "parameters": {"maximum": 2**70}}]
    assert "64 bits" in str(refused(input="x", tools=tools))


@pytest.mark.parametrize("body", [{"max_output_tokens": 2**64}, {"seed": -(2**63) - 1}, {"max_tool_calls": 2**63}])
def test_declared_integers_are_bounded_by_the_schema(body):
    with pytest.raises(ValidationError):
        CreateResponseRequest(model="m", input="x", **body)


def test_ids_must_look_like_ids():
    assert refused(input="x", previous_response_id="resp_1\x00").param in ("previous_response_id",)
    assert refused(input="x", previous_response_id="../etc").param == "previous_response_id"
    assert refused(input=[{"role": "user", "content": "x", "id": 7}]).param == "input[0].id"
    check_request(CreateResponseRequest(model="m", input=[{"role": "user", "content": "x", "id": "msg_1"}]))
