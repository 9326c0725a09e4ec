"""The Codex CLI (npm package @openai/codex), unmodified, against the real stack.

Two halves:
- The request bodies Codex 0.171.0 sends, replayed with plain httpx, streamed as Codex
  streams them. They are in fixtures/codex/, one file per model profile (Codex picks its
  tools, reasoning fields and instructions by the model's slug: a slug missing from its
  catalog gets fallback metadata; gpt-5.5 offers a client ``tool_search`` and a freeform
  ``apply_patch``; the gpt-6 family sends its tools in an ``additional_tools`` input item
  and sets ``reasoning.context``), each with the command that produced it. They were
  recorded by running ``codex exec`` (read-only sandbox, approvals never) with a scratch
  CODEX_HOME whose config.toml names a custom provider (``wire_api = "responses"``) at a
  logging proxy in front of a Steno stack, whose simulator workers served those model
  names and made the calls asked for; the scratch directory and CODEX_HOME appear as
  /home/user/project and /home/user/.codex.
- The real binary, installed by ``infra/codex`` (the test is skipped, with the script's
  message, only when npm or its registry cannot be reached), run by ``codex exec`` in a
  scratch directory against a simulator worker serving a model of Codex's catalog: a
  shell round trip, an ``apply_patch`` round trip (refused by the read-only sandbox, which
  the model is told) and ``codex exec resume``. Codex is kept on loopback: its update
  check, analytics and plugin sync are off, and any HTTP it tries elsewhere goes to a
  proxy address where nothing listens.

The simulator is driven by a line ``steno-simulator: call NAME ARGUMENTS`` in the user's
text; handed the tool's result, it answers "Steno simulator reply: the tool returned
<result>"."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.events_oracle import validate_events

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "codex"
# infra/codex's exit status when npm or its registry cannot be reached.
NPM_UNAVAILABLE = 69
REPLAY_MODEL = "steno-simulator"
# A slug of the pinned Codex's built-in catalog, served here by a simulator worker, so that
# Codex uses that model's profile (exec_command, freeform apply_patch, client tool_search);
# a slug it does not know gets fallback metadata, which offers no apply_patch.
CODEX_MODEL = "gpt-5.5"
CODEX_RUN_TIMEOUT_S = 60
# Nothing listens here: HTTP that Codex tries beyond loopback is refused at once.
NOWHERE_PROXY = "http://127.0.0.1:9"
REPLY = "Steno simulator reply: "
TOOL_REPLY = REPLY + "the tool returned "
_DIRECTIVE = re.compile(r"(?:^|\n)steno-simulator: call ([\w.-]+)")


# --- recorded request bodies, replayed ---------------------------------------------------


@dataclass(frozen=True)
class RecordedRequest:
    profile: str
    scenario: str
    body: dict[str, Any]


def _recorded_requests() -> list[RecordedRequest]:
    requests = []
    for path in sorted(FIXTURES.glob("*.json")):
        recording = json.loads(path.read_text())
        requests += [RecordedRequest(path.stem, request["scenario"], request["body"])
                     for request in recording["requests"]]
    return requests


RECORDED = _recorded_requests()


def sse_events(reply: httpx.Response) -> list[dict[str, Any]]:
    """Every SSE frame as {"event", "id", "data"}, as Codex's reader sees them."""
    events: list[dict[str, Any]] = []
    frame: dict[str, Any] = {}
    for line in reply.iter_lines():
        if not line:
            if "data" in frame:
                events.append(frame)
            frame = {}
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            frame[field] = value[1:] if value.startswith(" ") else value
    if "data" in frame:
        events.append(frame)
    return events


def _last_user_text(body: dict[str, Any]) -> str:
    for item in reversed(body["input"]):
        if item.get("type", "message") == "message" and item.get("role") == "user":
            content = item["content"]
            return content if isinstance(content, str) else "\n".join(part.get("text", "") for part in content)
    return ""


def _message_text(item: dict[str, Any]) -> str:
    return "".join(part.get("text", "") for part in item.get("content", []))


def test_every_profile_was_recorded():
    profiles = {request.profile for request in RECORDED}
    assert {"fallback", "gpt-5.5", "gpt-5.5-effort-xhigh", "gpt-5.5-effort-none", "gpt-6.2-sol"} <= profiles
    bodies = [request.body for request in RECORDED]
    assert all("client_metadata" in body for body in bodies)
    assert any({"type": "tool_search", "execution": "client"}.items() <= tool.items()
               for body in bodies for tool in body.get("tools", []))
    efforts = {body.get("reasoning", {}).get("effort") for body in bodies}
    assert {"xhigh", "none"} <= efforts
    assert any("context" in body.get("reasoning", {}) for body in bodies)
    assert any(item.get("type") == "additional_tools" for body in bodies for item in body["input"])


@pytest.mark.parametrize("recorded", RECORDED, ids=[f"{r.profile}: {r.scenario}" for r in RECORDED])
def test_a_recorded_codex_request_streams_to_completion(stack, recorded):
    body = {**recorded.body, "model": REPLAY_MODEL}
    headers = {**stack.headers(), "accept": "text/event-stream", "originator": "codex_exec"}
    with httpx.stream("POST", f"{stack.base_url}/responses", json=body, headers=headers, timeout=60) as reply:
        if reply.status_code != 200:
            reply.read()
            pytest.fail(f"{reply.status_code}: {reply.text}")
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = sse_events(reply)

    payloads = [json.loads(event["data"]) for event in events]
    validate_events([event["data"] for event in events])
    assert [event["event"] for event in events] == [payload["type"] for payload in payloads]
    assert [payload["sequence_number"] for payload in payloads] == list(range(len(payloads)))
    assert [int(event["id"]) for event in events] == list(range(len(payloads)))
    assert payloads[0]["type"] == "response.created"
    # Codex fails a turn whose stream closes before response.completed.
    assert payloads[-1]["type"] == "response.completed", payloads[-1]
    completed = payloads[-1]["response"]
    assert completed["id"] == payloads[0]["response"]["id"] and completed["usage"]["input_tokens"] > 0
    # Codex builds its history from the finished items; the final Response holds the same.
    done_items = [payload["item"] for payload in payloads if payload["type"] == "response.output_item.done"]
    assert done_items and done_items == completed["output"]

    last_input = body["input"][-1]
    answer = done_items[-1]
    if last_input.get("type") in ("function_call_output", "custom_tool_call_output"):
        assert answer["type"] == "message" and _message_text(answer).startswith(TOOL_REPLY), answer
        return
    directive = _DIRECTIVE.search(_last_user_text(body)) if last_input.get("role") == "user" else None
    if directive is None:
        assert answer["type"] == "message" and _message_text(answer).startswith(REPLY), answer
        return
    assert answer["type"] in ("function_call", "custom_tool_call"), answer
    assert answer["name"] == directive.group(1).rsplit(".", 1)[-1] and answer["call_id"]
    if answer["type"] == "function_call":
        assert isinstance(json.loads(answer["arguments"]), dict)


# --- the real binary ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def codex_binary() -> Path:
    installed = subprocess.run([str(ROOT / "infra" / "codex")], capture_output=True, text=True, timeout=600)
    if installed.returncode == NPM_UNAVAILABLE:
        pytest.skip(installed.stderr.strip() or "infra/codex: npm or its registry cannot be reached")
    if installed.returncode != 0:
        pytest.fail(f"infra/codex failed ({installed.returncode}):\n{installed.stderr}")
    return Path(installed.stdout.strip().splitlines()[-1])


def _served_models(stack) -> set[str]:
    listed = httpx.get(f"{stack.base_url}/models", headers=stack.headers(), timeout=10)
    return {model["id"] for model in listed.json()["data"]}


@pytest.fixture(scope="module")
def codex_model(stack) -> Iterator[str]:
    worker = stack.add("worker-codex", "worker", "--model", CODEX_MODEL, "--sim-tokens-per-s", "0")
    deadline = time.monotonic() + 30
    while CODEX_MODEL not in _served_models(stack):
        assert worker.exited() is None, worker.log_text()
        assert time.monotonic() < deadline, f"no worker for {CODEX_MODEL}:\n{worker.log_text()}"
        time.sleep(0.2)
    yield CODEX_MODEL
    worker.stop()


@dataclass(frozen=True)
class CodexTurn:
    thread_id: str
    events: list[dict[str, Any]]
    last_message: str

    def items(self, kind: str) -> list[dict[str, Any]]:
        return [event["item"] for event in self.events
                if event["type"] == "item.completed" and event["item"]["type"] == kind]

    @property
    def input_tokens(self) -> int:
        return next(event["usage"]["input_tokens"] for event in self.events if event["type"] == "turn.completed")


class Codex:
    """``codex exec`` in a scratch directory, with a CODEX_HOME of its own whose provider is the stack."""

    def __init__(self, binary: Path, home: Path, workdir: Path, base_url: str, api_key: str) -> None:
        self.binary = binary
        self.workdir = workdir
        workdir.mkdir()
        home.mkdir()
        (home / "config.toml").write_text(f"""\
model_provider = "steno"
check_for_update_on_startup = false

[analytics]
enabled = false

# Plugins and apps are fetched from GitHub and ChatGPT: nothing this test reaches.
[features]
plugins = false
remote_plugin = false
apps = false

[model_providers.steno]
name = "Steno"
base_url = "{base_url}"
wire_api = "responses"
env_key = "STENO_API_KEY"
# A failure shows at once instead of after Codex's retries and backoff.
request_max_retries = 0
stream_max_retries = 0
""")
        self.env = {
            **{name: value for name, value in os.environ.items() if not name.startswith(("CODEX_", "OPENAI_"))},
            "CODEX_HOME": str(home),
            "STENO_API_KEY": api_key,
            "HTTP_PROXY": NOWHERE_PROXY, "HTTPS_PROXY": NOWHERE_PROXY, "ALL_PROXY": NOWHERE_PROXY,
            "http_proxy": NOWHERE_PROXY, "https_proxy": NOWHERE_PROXY, "all_proxy": NOWHERE_PROXY,
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        }

    def exec(self, model: str, prompt: str, *, resume: bool = False) -> CodexTurn:
        # The sandbox as a setting rather than --sandbox, which `exec resume` does not take.
        command = [str(self.binary), "exec", *(["resume", "--last"] if resume else []), "--json",
                   "--skip-git-repo-check", "-c", 'sandbox_mode="read-only"', "-c", 'approval_policy="never"',
                   "-m", model, prompt]
        done = subprocess.run(command, cwd=self.workdir, env=self.env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=CODEX_RUN_TIMEOUT_S)
        assert done.returncode == 0, f"codex exec exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert events and events[-1]["type"] == "turn.completed", f"{done.stdout}\n{done.stderr}"
        thread_id = next(event["thread_id"] for event in events if event["type"] == "thread.started")
        messages = [event["item"]["text"] for event in events
                    if event["type"] == "item.completed" and event["item"]["type"] == "agent_message"]
        assert messages, done.stdout
        return CodexTurn(thread_id, events, messages[-1])


def shell_directive(command: str) -> str:
    """Asks for Codex's shell tool; without a login shell, whose profile scripts may print."""
    return "steno-simulator: call exec_command " + json.dumps({"cmd": command, "login": False})


@pytest.fixture(scope="module")
def codex(codex_binary, codex_model, stack, tmp_path_factory) -> Codex:
    scratch = tmp_path_factory.mktemp("codex")
    return Codex(codex_binary, scratch / "codex-home", scratch / "project", stack.base_url, stack.keys["a"])


def test_a_shell_round_trip(codex, codex_model):
    turn = codex.exec(codex_model, shell_directive("echo steno-roundtrip"))
    [command] = turn.items("command_execution")
    assert command["exit_code"] == 0 and command["aggregated_output"].strip() == "steno-roundtrip"
    assert turn.last_message.startswith(TOOL_REPLY) and "steno-roundtrip" in turn.last_message


def test_an_apply_patch_round_trip_under_the_read_only_sandbox(codex, codex_model):
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch"
    turn = codex.exec(codex_model, f"steno-simulator: call apply_patch {patch}")
    # The sandbox refuses the write; the model is handed the refusal and reports it.
    assert turn.last_message.startswith(TOOL_REPLY) and "read-only sandbox" in turn.last_message
    assert not (codex.workdir / "hello.txt").exists()


def test_resume_continues_the_last_session(codex, codex_model):
    first = codex.exec(codex_model, shell_directive("echo steno-first"))
    resumed = codex.exec(codex_model, shell_directive("echo steno-resumed"), resume=True)
    assert resumed.thread_id == first.thread_id
    # The resumed turn's prompt carries the first turn's history.
    assert resumed.input_tokens > first.input_tokens
    assert resumed.last_message.startswith(REPLY)
    assert "steno-resumed" in resumed.last_message
