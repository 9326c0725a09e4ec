import pytest

from steno.schemas.api import CreateResponseRequest
from steno.services.dialects import InvalidInput
from steno.services.dialects.harmony.render import build_conversation
from tests.harmony_samples import encoding, harmony


def decoded(request: CreateResponseRequest) -> str:
    return encoding().decode(harmony().render(request, 1767225600).token_ids)


def test_string_input_system_and_start_date():
    text = decoded(CreateResponseRequest(model="m", input="Hello"))
    assert "Reasoning: medium" in text
    assert "Current date: 2026-01-01" in text
    assert text.endswith("<|start|>user<|message|>Hello<|end|><|start|>assistant")


def test_reasoning_effort_and_instructions():
    text = decoded(CreateResponseRequest(model="m", input="x", instructions="Be terse.", reasoning={"effort": "high"}))
    assert "Reasoning: high" in text
    assert "<|start|>developer<|message|># Instructions\n\nBe terse." in text


def test_system_role_input_becomes_developer_instructions():
    request = CreateResponseRequest(
        model="m", input=[{"role": "system", "content": "Speak French."}, {"role": "user", "content": "Hi"}]
    )
    text = decoded(request)
    assert "# Instructions\n\nSpeak French." in text
    assert "<|start|>system<|message|>Speak French." not in text


def test_function_tools_are_declared():
    tool = {"type": "function", "name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    text = decoded(CreateResponseRequest(model="m", input="x", tools=[tool]))
    assert "namespace functions" in text and "type get_weather" in text


ANSWER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_a_json_answer_is_asked_for_in_a_response_formats_section_at_the_end():
    text_format = {"type": "json_schema", "name": "answer", "description": "The city.\nOne only.", "schema": ANSWER}
    text = decoded(CreateResponseRequest(model="m", input="x", instructions="Be terse.", text={"format": text_format}))
    assert ('# Instructions\n\nBe terse.\n\n# Response Formats\n\n## answer\n\n// The city.\n// One only.\n'
            '{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}<|end|>') in text
    alone = decoded(CreateResponseRequest(model="m", input="x", text={"format": {"type": "json_object"}}))
    assert '<|start|>developer<|message|># Response Formats\n\n## json_object\n\n// A JSON object.\n' \
           '{"type":"object"}<|end|>' in alone
    plain = decoded(CreateResponseRequest(model="m", input="x", text={"format": {"type": "text"}}))
    assert "Response Formats" not in plain


def test_parameter_descriptions_are_kept_on_one_line():
    tool = {"type": "function", "name": "run", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string", "description": "The command.\nOne line."}}}}
    text = decoded(CreateResponseRequest(model="m", input="x", tools=[tool]))
    assert "// The command. One line.\ncmd?: string," in text


def test_function_call_round_trip_items():
    request = CreateResponseRequest(model="m", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "function_call", "name": "get_weather", "call_id": "call_1", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ])
    text = decoded(request)
    assert "to=functions.get_weather" in text
    assert "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny" in text


@pytest.mark.parametrize(
    ("items", "param"),
    [
        ([{"type": "image_generation_call", "id": "x"}], "input[0].type"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], "input[0].content[0]"),
        ([{"type": "function_call_output", "call_id": "nope", "output": "x"}], "input[0].call_id"),
        ([{"role": "wizard", "content": "x"}], "input[0].role"),
    ],
)
def test_unsupported_input_names_the_item(items, param):
    with pytest.raises(InvalidInput) as info:
        build_conversation(CreateResponseRequest(model="m", input=items), 0)
    assert info.value.param == param


WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather now",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
REASONED_TURN = [
    {"role": "user", "content": "Weather in Paris?"},
    {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "I should call the tool."}]},
    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "18C"},
    {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Now answer."}]},
    {"role": "assistant", "content": "It is 18C."},
]


@pytest.mark.parametrize("request_body", [
    {"input": "Hello"},
    {"input": "x", "instructions": "Be terse.", "reasoning": {"effort": "high"}},
    {"input": "x", "tools": [WEATHER_TOOL], "tool_choice": "required"},
    {"input": "x", "tools": [{"type": "web_search"}, {"type": "code_interpreter", "container": {"type": "auto"}}]},
    # A finished turn: its analysis is dropped, as Harmony drops it.
    {"input": [*REASONED_TURN, {"role": "user", "content": "And tomorrow?"}], "tools": [WEATHER_TOOL]},
    # A turn still reasoning: its analysis stays.
    {"input": REASONED_TURN[:4], "tools": [WEATHER_TOOL]},
    {"input": [{"role": "developer", "content": "Speak French."}, {"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Salut", "phase": "commentary"}]},
    {"input": "x", "tools": [WEATHER_TOOL], "text": {"format": {"type": "json_object"}}},
])
def test_rendering_reuses_messages_and_matches_harmony_rendering_the_whole_conversation(request_body):
    """The prompt is rendered message by message, reusing messages rendered before; it
    must be token for token what Harmony renders for the whole conversation."""
    from openai_harmony import Role

    request = CreateResponseRequest(model="m", **request_body)
    conversation, _ = build_conversation(request, 1767225600)
    whole = encoding().render_conversation_for_completion(conversation, Role.ASSISTANT)
    assert harmony().render(request, 1767225600).token_ids == whole
    assert harmony().render(request, 1767225600).token_ids == whole  # from the reused messages


def test_a_replayed_bare_call_goes_to_the_top_level_tool_not_a_namespaced_namesake():
    search = {"type": "function", "name": "search", "parameters": {"type": "object", "properties": {}}}
    crm = {"type": "namespace", "name": "crm", "tools": [dict(search)]}
    call = [{"role": "user", "content": "find it"},
            {"type": "function_call", "call_id": "c1", "name": "search", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "found"}]
    text = decoded(CreateResponseRequest(model="m", input=call, tools=[search, crm]))
    assert "to=functions.search<|channel|>" in text
    assert "<|start|>functions.search to=assistant" in text
    assert "functions.crm.search<|" not in text


def test_a_replayed_ambiguous_bare_call_is_rendered_as_received():
    namespaced = [{"type": "namespace", "name": ns, "tools": [{"type": "function", "name": "search"}]}
                  for ns in ("crm", "docs")]
    call = [{"role": "user", "content": "find it"},
            {"type": "function_call", "call_id": "c1", "name": "search", "arguments": "{}"}]
    text = decoded(CreateResponseRequest(model="m", input=call, tools=namespaced))
    assert "to=functions.search<|channel|>" in text


def test_the_rendered_prompt_names_its_dialect_tools_and_stop_tokens():
    tool = {"type": "custom", "name": "apply_patch"}
    rendered = harmony().render(CreateResponseRequest(model="m", input="x", tools=[tool]), 0)
    assert rendered.parse_context.dialect == "harmony"
    assert rendered.parse_context.prompt_tokens == len(rendered.token_ids)
    assert rendered.parse_context.function_tools == ["apply_patch"]
    assert rendered.parse_context.custom_tools == ["apply_patch"]
    stops = {encoding().decode([token]) for token in rendered.stop_token_ids}
    assert stops == {"<|return|>", "<|call|>"}


def test_rendered_messages_are_reused_only_within_their_tenant():
    """A tenant's text (its instructions, its messages) serves only its own requests;
    the system message, which holds none, serves everyone's; nothing large is kept."""
    from steno.services.dialects.harmony.render import ConversationRenderer

    renderer = ConversationRenderer(encoding())
    huge_instructions = "x" * 70_000
    for request in (CreateResponseRequest(model="m", input="my secret plan", instructions="Be brief."),
                    CreateResponseRequest(model="m", input="hi", instructions=huge_instructions)):
        renderer.render(build_conversation(request, 0)[0], reuse_scope="tenant-a")
    kept = {(scope, text) for scope, text, _ in renderer.reused.kept()}
    assert {scope for scope, text in kept if "Be brief." in text or "secret" in text} == {"tenant-a"}
    assert {scope for scope, text in kept if '"system"' in text} == {""}
    assert not any(huge_instructions in text for _, text in kept)
    conversation, _ = build_conversation(CreateResponseRequest(model="m", input="my secret plan",
                                                               instructions="Be brief."), 0)
    assert renderer.render(conversation, reuse_scope="tenant-b") == renderer.render(conversation, "tenant-a")
    scopes_of_the_secret = {scope for scope, text, _ in renderer.reused.kept() if "secret" in text}
    assert scopes_of_the_secret == {"tenant-a", "tenant-b"}  # rendered again for b, not served from a's


def test_what_is_kept_for_reuse_stays_within_its_byte_budget():
    from steno.services.dialects.harmony.render import ConversationRenderer

    renderer = ConversationRenderer(encoding())
    for index in range(400):
        request = CreateResponseRequest(model="m", input="x", instructions=f"{index} " + "word " * 8000)
        renderer.render(build_conversation(request, 0)[0], reuse_scope="t")
    assert 0 < renderer.reused.kept_bytes <= renderer.reused.max_bytes
    assert len(renderer.reused.kept()) < 400


LOOKUP = {"type": "function", "name": "lookup", "description": "Look it up",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}


def test_tools_added_by_input_items_are_declared_with_the_rest():
    text = decoded(CreateResponseRequest(model="m", input=[
        {"type": "additional_tools", "role": "developer",
         "tools": [{"type": "namespace", "name": "functions", "tools": [LOOKUP]},
                   {"type": "namespace", "name": "crm", "tools": [{**LOOKUP, "name": "find"}]}]},
        {"role": "user", "content": "find it"},
    ]))
    assert "type lookup = " in text and "type crm.find = " in text
    assert "// Look it up" in text


def test_a_client_tool_search_round_trip_renders_as_a_call_and_its_result_loads_the_tools():
    search = {"type": "tool_search", "execution": "client", "description": "Find tools."}
    text = decoded(CreateResponseRequest(model="m", tools=[search], input=[
        {"role": "user", "content": "weather?"},
        {"type": "tool_search_call", "call_id": "ts1", "execution": "client", "arguments": {"query": "weather"}},
        {"type": "tool_search_output", "call_id": "ts1", "execution": "client", "tools": [LOOKUP]},
    ]))
    assert "type tool_search = " in text and "type lookup = " in text
    assert 'to=functions.tool_search<|channel|>commentary json<|message|>{"query":"weather"}' in text
    assert '<|start|>functions.tool_search to=assistant<|channel|>commentary<|message|>' \
           '[{"name":"lookup","description":"Look it up"}]' in text


def test_a_tool_search_output_without_its_call_is_refused():
    with pytest.raises(InvalidInput) as refused:
        harmony().render(CreateResponseRequest(model="m", input=[
            {"type": "tool_search_output", "call_id": "nope", "tools": []}]), 0)
    assert refused.value.param == "input[0].call_id"


def test_calls_of_client_run_built_in_tools_and_their_outputs_render_as_calls_and_results():
    request = CreateResponseRequest(model="m", tools=[{"type": "shell"}, {"type": "local_shell"},
                                                      {"type": "apply_patch"}], input=[
        {"role": "user", "content": "Tidy up."},
        {"type": "shell_call", "call_id": "c1", "action": {"commands": ["ls"], "timeout_ms": None}},
        {"type": "shell_call_output", "call_id": "c1",
         "output": [{"stdout": "a.txt\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]},
        {"type": "local_shell_call", "id": "lsh_1", "call_id": "c2", "status": "completed",
         "action": {"type": "exec", "command": ["rm", "a.txt"], "env": {}}},
        {"type": "local_shell_call_output", "id": "c2", "output": "removed"},
        {"type": "apply_patch_call", "call_id": "c3", "status": "completed",
         "operation": {"type": "create_file", "path": "b.txt", "diff": "+b\n"}},
        {"type": "apply_patch_call_output", "call_id": "c3", "status": "completed", "output": "created"},
    ])
    text = decoded(request)
    assert 'to=functions.shell<|channel|>commentary json<|message|>{"commands":["ls"]}<|call|>' in text
    assert '<|start|>functions.shell to=assistant<|channel|>commentary<|message|>[{"stdout":"a.txt\\n"' in text
    assert 'to=functions.local_shell<|channel|>commentary json<|message|>{"command":["rm","a.txt"],' \
           '"env":{}}' in text
    assert '<|start|>functions.local_shell to=assistant<|channel|>commentary<|message|>removed<|end|>' in text
    assert '{"type":"create_file","path":"b.txt","diff":"+b\\n"}<|call|>' in text
    assert '<|start|>functions.apply_patch to=assistant<|channel|>commentary<|message|>' \
           '{"status":"completed","output":"created"}<|end|>' in text


def test_a_client_tool_output_without_its_call_is_refused():
    with pytest.raises(InvalidInput) as refused:
        harmony().render(CreateResponseRequest(model="m", input=[
            {"role": "user", "content": "x"}, {"type": "local_shell_call_output", "id": "nope", "output": "x"}]), 0)
    assert refused.value.param == "input[1].call_id"
