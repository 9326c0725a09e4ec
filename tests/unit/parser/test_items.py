"""Golden cases: real Harmony token sequences through the parser in random batch splits;
every event validates against the SDK, and the final snapshot says what was streamed."""

import orjson
import pytest

from steno.schemas.fold import fold
from steno.schemas.responses import ParseContext
from steno.services.parser.items import unwrap_custom_input, web_search_action
from tests.events_oracle import validate_events, validate_response
from tests.harmony_samples import assistant, completion
from tests.parse_support import random_sizes, run

SPLITS = [[10_000], [1] * 400, random_sizes(1, 400), random_sizes(2, 400, largest=3)]


def parse(messages, context=ParseContext(), end="<|return|>", finish="stop"):
    """Parses under every split; checks they agree and conform; returns (snapshot, event types)."""
    tokens = completion(messages, end=end)
    results = []
    for sizes in SPLITS:
        state, events = run(tokens, sizes, finish=finish, context=context)
        parsed = validate_events([e.payload for e in events])
        assert [e.sequence_number for e in parsed] == list(range(1, len(parsed) + 1))
        assert fold(orjson.loads(e.payload) for e in events) == state.final_snapshot
        validate_response(state.final_snapshot)
        results.append((state.final_snapshot, [e.type for e in events]))
    snapshots = {orjson.dumps(snapshot) for snapshot, _ in results}
    assert len(snapshots) == 1, "batch boundaries changed the final snapshot"
    return results[0][0], set(results[0][1])


def test_preamble_is_a_commentary_message_before_the_call():
    snapshot, _ = parse(
        [
            assistant("commentary", "Let me look that up."),
            assistant("commentary", '{"q": 1}', recipient="functions.lookup", content_type="json"),
        ],
        end="<|call|>",
    )
    preamble, call = snapshot["output"]
    assert preamble["type"] == "message" and preamble["phase"] == "commentary"
    assert preamble["content"][0]["text"] == "Let me look that up."
    assert call["type"] == "function_call" and call["name"] == "lookup"


def test_namespaced_function_is_reported_with_its_namespace_apart():
    context = ParseContext(function_tools=["crm.find_user"], namespaces=["crm"])
    snapshot, _ = parse(
        [assistant("commentary", '{"email":"a@b.c"}', recipient="functions.crm.find_user", content_type="json")],
        context, end="<|call|>",
    )
    call = snapshot["output"][0]
    assert (call["namespace"], call["name"], call["arguments"]) == ("crm", "find_user", '{"email":"a@b.c"}')


def test_custom_tool_call_carries_the_unwrapped_input():
    context = ParseContext(function_tools=["apply_patch"], custom_tools=["apply_patch"])
    snapshot, types = parse(
        [assistant("commentary", '{"input": "*** Begin Patch\\n+ é\\n"}', recipient="functions.apply_patch",
                   content_type="json")],
        context, end="<|call|>",
    )
    call = snapshot["output"][0]
    assert call["type"] == "custom_tool_call"
    assert call["input"] == "*** Begin Patch\n+ é\n"
    assert call["call_id"].startswith("call_")
    assert {"response.custom_tool_call_input.delta", "response.custom_tool_call_input.done"} <= types


@pytest.mark.parametrize(
    ("recipient", "arguments", "action"),
    [
        ("browser.search", '{"query": "steno pipeline"}', {"type": "search", "query": "steno pipeline"}),
        ("browser.open", '{"id": "https://example.com", "cursor": 1}', {"type": "open_page", "url": "https://example.com"}),
        ("browser.open", '{"id": 3, "cursor": 2}', {"type": "open_page", "url": "cursor:2"}),
        ("browser.find", '{"pattern": "NATS", "cursor": 4}',
         {"type": "find_in_page", "pattern": "NATS", "url": "cursor:4"}),
    ],
)
def test_browser_calls_become_web_search_calls(recipient, arguments, action):
    snapshot, types = parse([assistant("analysis", arguments, recipient=recipient)], end="<|call|>")
    item = snapshot["output"][0]
    assert item["type"] == "web_search_call" and item["status"] == "completed"
    assert item["action"] == action
    assert {"response.web_search_call.in_progress", "response.web_search_call.searching",
            "response.web_search_call.completed"} <= types


def test_python_becomes_a_code_interpreter_call():
    code = "import math\nprint(math.pi)"
    snapshot, types = parse([assistant("analysis", code, recipient="python")], end="<|call|>")
    item = snapshot["output"][0]
    assert item["type"] == "code_interpreter_call"
    assert item["code"] == code and item["outputs"] == [] and item["container_id"] == "auto"
    assert {"response.code_interpreter_call_code.delta", "response.code_interpreter_call.interpreting",
            "response.code_interpreter_call.completed"} <= types


@pytest.mark.parametrize(
    ("recipient", "name", "label"),
    [("mcp.search_docs", "search_docs", "search_docs"), ("container.exec", "container.exec", "container"),
     ("weather_service", "weather_service", "weather_service")],
)
def test_mcp_and_unknown_recipients_become_mcp_calls(recipient, name, label):
    snapshot, types = parse([assistant("commentary", '{"a": 1}', recipient=recipient, content_type="json")],
                            end="<|call|>")
    item = snapshot["output"][0]
    reported = (item["type"], item["name"], item["server_label"], item["arguments"])
    assert reported == ("mcp_call", name, label, '{"a": 1}')
    assert {"response.mcp_call.in_progress", "response.mcp_call_arguments.done", "response.mcp_call.completed"} <= types


def test_invalid_json_arguments_are_reported_as_written():
    snapshot, _ = parse(
        [assistant("commentary", '{"city": "Par', recipient="functions.get_weather", content_type="json")],
        end="<|call|>",
    )
    assert snapshot["output"][0]["arguments"] == '{"city": "Par'
    assert snapshot["status"] == "completed"


def test_unknown_channel_text_is_kept_as_a_message():
    snapshot, _ = parse([assistant("scratchpad", "stray words")])
    assert snapshot["output"][0]["type"] == "message"
    assert snapshot["output"][0]["content"][0]["text"] == "stray words"


def test_truncated_header_leaves_earlier_items_and_ends_incomplete():
    tokens = completion([assistant("analysis", "thinking"), assistant("final", "answer")])
    cut = tokens.index(200005, 3)  # the second message's <|channel|>: inside its header
    state, events = run(tokens[:cut + 1], [2] * 50, finish="length")
    validate_events([e.payload for e in events])
    snapshot = validate_response(state.final_snapshot)
    assert snapshot.status == "incomplete"
    assert [item.type for item in snapshot.output] == ["reasoning"]
    assert snapshot.output[0].content[0].text == "thinking"


def test_call_cut_by_the_token_limit_is_incomplete():
    tokens = completion([assistant("commentary", '{"city": "Paris"}', recipient="functions.f", content_type="json")],
                        end="<|call|>")
    state, _ = run(tokens[:-3], [4] * 50, finish="length")
    assert state.final_snapshot["output"][0]["status"] == "incomplete"


def test_unwrap_custom_input_degrades_to_the_raw_payload():
    assert unwrap_custom_input('{"input": "x"}') == "x"
    assert unwrap_custom_input('{"patch": "y"}') == "y"
    assert unwrap_custom_input("not json") == "not json"
    assert unwrap_custom_input('{"a": 1, "b": 2}') == '{"a": 1, "b": 2}'


def test_web_search_action_of_unparseable_arguments_is_a_search():
    assert web_search_action("search", "steno") == {"type": "search", "query": "steno"}


def test_grammar_violation_keeps_the_text_and_fails_visibly():
    from tests.harmony_samples import encoding

    tokens = completion([assistant("final", "so far so good")], end="<|end|>")
    tokens += encoding().encode("<|message|>garbage", allowed_special="all")
    state, events = run(tokens, [3] * 50)
    validate_events([e.payload for e in events])
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    snapshot = validate_response(state.final_snapshot)
    assert snapshot.output_text == "so far so good"
    assert "malformed" in snapshot.error.message


def test_constrained_final_answer_is_a_message_not_a_call():
    from tests.harmony_samples import encoding

    for header in ("<|channel|>final <|constrain|>json<|message|>", "<|channel|>final json<|message|>"):
        tokens = encoding().encode(header + '{"a": 1}<|return|>', allowed_special="all")
        state, events = run(tokens, [3] * 30)
        validate_events([e.payload for e in events])
        item = state.final_snapshot["output"][0]
        assert item["type"] == "message", header
        assert item["content"][0]["text"] == '{"a": 1}'


def test_a_client_tool_search_call_is_reported_as_a_tool_search_call():
    context = ParseContext(function_tools=["tool_search"], tool_search=True)
    snapshot, types = parse(
        [assistant("commentary", '{"query": "weather"}', recipient="functions.tool_search", content_type="json")],
        context, end="<|call|>",
    )
    (call,) = snapshot["output"]
    assert call["type"] == "tool_search_call" and call["execution"] == "client"
    assert call["arguments"] == {"query": "weather"} and call["call_id"].startswith("call_")
    assert types == {"response.in_progress", "response.output_item.added", "response.output_item.done",
                     "response.completed"}


def test_a_function_named_tool_search_is_a_function_when_no_tool_search_was_offered():
    context = ParseContext(function_tools=["tool_search"])
    snapshot, _ = parse(
        [assistant("commentary", '{"q": 1}', recipient="functions.tool_search", content_type="json")],
        context, end="<|call|>",
    )
    assert snapshot["output"][0]["type"] == "function_call"


CLIENT_CALLS = [
    ("shell", {"commands": ["ls -la", "pwd"], "timeout_ms": 5000},
     {"type": "shell_call", "action": {"commands": ["ls -la", "pwd"], "timeout_ms": 5000, "max_output_length": None}}),
    ("local_shell", {"command": ["echo", "hi"], "working_directory": "/tmp"},
     {"type": "local_shell_call", "action": {"type": "exec", "command": ["echo", "hi"], "env": {}, "timeout_ms": None,
                                             "user": None, "working_directory": "/tmp"}}),
    ("apply_patch", {"type": "create_file", "path": "a.txt", "diff": "+hi\n"},
     {"type": "apply_patch_call", "operation": {"type": "create_file", "path": "a.txt", "diff": "+hi\n"}}),
    ("apply_patch", {"type": "delete_file", "path": "a.txt"},
     {"type": "apply_patch_call", "operation": {"type": "delete_file", "path": "a.txt"}}),
]


@pytest.mark.parametrize(("name", "arguments", "expected"), CLIENT_CALLS)
def test_calls_of_client_run_built_in_tools_are_reported_as_their_call_items(name, arguments, expected):
    context = ParseContext(function_tools=[name], client_tools=[name])
    snapshot, types = parse([assistant("commentary", orjson.dumps(arguments).decode(), recipient=f"functions.{name}",
                                       content_type="json")], context, end="<|call|>")
    (call,) = snapshot["output"]
    assert {key: call[key] for key in expected} == expected
    assert call["status"] == "completed" and call["call_id"].startswith("call_")
    assert types == {"response.in_progress", "response.output_item.added", "response.output_item.done",
                     "response.completed"}


@pytest.mark.parametrize("arguments", ['{"commands": "ls"}', "not json", '{"type": "update_file", "path": "a"}'])
def test_arguments_that_make_no_call_item_are_a_function_call_as_written(arguments):
    name = "apply_patch" if "update_file" in arguments else "shell"
    context = ParseContext(function_tools=[name], client_tools=[name])
    snapshot, _ = parse([assistant("commentary", arguments, recipient=f"functions.{name}", content_type="json")],
                        context, end="<|call|>")
    (call,) = snapshot["output"]
    assert (call["type"], call["name"], call["arguments"]) == ("function_call", name, arguments)
    assert call["id"].startswith("fc_")
