"""Third-party agent clients, unmodified, against the real stack: the OpenAI Agents SDK,
LiteLLM and langchain-openai. For each: a local function tool run between two model
calls, streaming, chaining by previous_response_id, store=false, and structured output
(an answer parsed into the client's own type).

What the simulator says decides what is asserted: offered one function tool, it calls
it with the user's text as every string argument; handed the tool's output, it answers
"Steno simulator reply: the tool returned <output>"; otherwise it echoes the user, and an
answer asked for as JSON is a small instance of the schema whose strings hold that echo.
Nothing here may reach past this machine: each library's offline switches are set, and
any connection or name lookup outside loopback fails the test that made it."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import openai
import pytest
from pydantic import BaseModel, Field

from tests.conftest import SLOW_MODEL

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"
REPLY = "Steno simulator reply: "
# The streaming tests ask a worker that speaks a few tokens a second: a fast one can
# finish within one batch interval and so send its whole answer as a single delta.
STREAMING_MODEL = SLOW_MODEL
# Every answer here takes a few seconds at most; a response that never ends fails its test
# after this long instead of holding the run for the clients' default ten minutes.
TIMEOUT_S = 30

# Each library reads some of these once, at import or first use: they are set before
# the libraries are imported, and the whole environment is put back afterwards.
OFFLINE_ENVIRONMENT = {
    # LiteLLM: the bundled model cost map instead of fetching it, and nothing else fetched.
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_OFFLINE_MODE": "true",
    # Hugging Face tokenizers LiteLLM could fetch for counting tokens of some models.
    "HF_HUB_OFFLINE": "1",
    # The Agents SDK exports traces to OpenAI unless told not to.
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    # LangChain sends traces to LangSmith when an environment turns tracing on.
    "LANGSMITH_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
}


def shipping_status(order_id: str) -> str:
    return f"order {order_id} shipped on Tuesday"


ORDER_TOOL = {
    "type": "function",
    "name": "look_up_order",
    "description": "Look up where an order is.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
}


class Delivery(BaseModel):
    """A structured answer, as clients declare one."""

    order_id: str
    days: int = Field(ge=1)
    signed_for: bool


def _is_local(host: object) -> bool:
    if host is None or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(scope="module")
def outside_attempts(stack) -> Iterator[list[str]]:
    """Every connection or name lookup a client library tried beyond loopback (each
    refused at once, so a library that phones home fails fast instead of hanging).
    Depends on ``stack`` so that the services start before any of this is in place."""
    attempts: list[str] = []
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def refuse_outside(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address[0]):
            attempts.append(f"connect {address}")
            raise ConnectionRefusedError(f"test refuses connections outside loopback: {address}")

    def connect(sock: socket.socket, address: Any) -> None:
        refuse_outside(sock, address)
        return real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        refuse_outside(sock, address)
        return real_connect_ex(sock, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_local(host.decode() if isinstance(host, bytes) else host):
            attempts.append(f"lookup {host}")
            raise socket.gaierror(socket.EAI_NONAME, f"test refuses name lookups outside loopback: {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    saved_environment = dict(os.environ)
    os.environ.update(OFFLINE_ENVIRONMENT)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", connect)
        patch.setattr(socket.socket, "connect_ex", connect_ex)
        patch.setattr(socket, "getaddrinfo", getaddrinfo)
        try:
            yield attempts
        finally:
            # LiteLLM also writes TIKTOKEN_CACHE_DIR on import: put everything back.
            os.environ.clear()
            os.environ.update(saved_environment)


@pytest.fixture(autouse=True)
def stays_on_this_machine(outside_attempts) -> Iterator[None]:
    already = len(outside_attempts)
    yield
    assert outside_attempts[already:] == [], "a client library tried to reach past this machine"


# --- OpenAI Agents SDK -------------------------------------------------------------------


@pytest.fixture(scope="module")
def agents_sdk(outside_attempts) -> ModuleType:
    import agents

    return agents


@pytest.fixture
async def async_openai(stack) -> Any:
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0, timeout=TIMEOUT_S)
    yield client
    await client.close()


class AgentWorld:
    """An agent with the order tool, on a model pointed at the stack, and what the tool was asked."""

    def __init__(self, agents: ModuleType, client: openai.AsyncOpenAI) -> None:
        self.agents = agents
        self.client = client
        self.tool_ran_for: list[str] = []
        self.run_config = agents.RunConfig(tracing_disabled=True)

        def look_up_order(order_id: str) -> str:
            """Look up where an order is."""
            self.tool_ran_for.append(order_id)
            return shipping_status(order_id)

        self.order_tool = agents.function_tool(look_up_order)

    def agent(self, tools: bool = True, model: str = MODEL, **model_settings: Any) -> Any:
        agents = self.agents
        return agents.Agent(
            name="clerk",
            instructions="Answer questions about orders.",
            model=agents.OpenAIResponsesModel(model=model, openai_client=self.client),
            model_settings=agents.ModelSettings(**model_settings),
            tools=[self.order_tool] if tools else [],
        )


@pytest.fixture
def agent_world(agents_sdk, async_openai) -> AgentWorld:
    return AgentWorld(agents_sdk, async_openai)


async def test_agents_sdk_runs_a_local_tool_and_answers_with_its_result(agent_world):
    result = await agent_world.agents.Runner.run(agent_world.agent(), "A-1001", run_config=agent_world.run_config)
    assert agent_world.tool_ran_for == ["A-1001"]
    assert result.final_output == REPLY + "the tool returned " + shipping_status("A-1001")
    assert [response.output[-1].type for response in result.raw_responses] == ["function_call", "message"]


async def test_agents_sdk_streams_text_that_assembles_into_the_final_output(agent_world):
    from openai.types.responses import ResponseTextDeltaEvent

    agent = agent_world.agent(tools=False, model=STREAMING_MODEL)
    streamed = agent_world.agents.Runner.run_streamed(agent, "stream this to me", run_config=agent_world.run_config)
    deltas = [event.data.delta async for event in streamed.stream_events()
              if event.type == "raw_response_event" and isinstance(event.data, ResponseTextDeltaEvent)]
    assert len(deltas) > 1
    assert "".join(deltas) == streamed.final_output == REPLY + "stream this to me"


async def test_agents_sdk_chains_the_tool_output_onto_the_turn_that_asked_for_it(agent_world):
    # auto_previous_response_id: after running the tool the SDK sends only its output,
    # naming the response that made the call; the server must find the call there.
    result = await agent_world.agents.Runner.run(agent_world.agent(), "A-1002", auto_previous_response_id=True,
                                                 run_config=agent_world.run_config)
    assert agent_world.tool_ran_for == ["A-1002"]
    assert result.final_output == REPLY + "the tool returned " + shipping_status("A-1002")
    asked, answered = (response.response_id for response in result.raw_responses)
    assert (await agent_world.client.responses.retrieve(answered)).previous_response_id == asked
    sent = await agent_world.client.responses.input_items.list(answered)
    assert [item.type for item in sent.data] == ["function_call_output"]


async def test_agents_sdk_runs_a_tool_round_trip_without_storing_anything(agent_world):
    result = await agent_world.agents.Runner.run(agent_world.agent(store=False), "A-1003",
                                                 run_config=agent_world.run_config)
    assert agent_world.tool_ran_for == ["A-1003"]
    assert result.final_output == REPLY + "the tool returned " + shipping_status("A-1003")
    for response in result.raw_responses:
        with pytest.raises(openai.NotFoundError):
            await agent_world.client.responses.retrieve(response.response_id)


async def test_agents_sdk_parses_a_structured_answer_into_its_output_type(agent_world):
    agent = agent_world.agent(tools=False).clone(output_type=Delivery)
    result = await agent_world.agents.Runner.run(agent, "A-1004", run_config=agent_world.run_config)
    assert isinstance(result.final_output, Delivery)
    assert result.final_output.order_id == REPLY + "A-1004" and result.final_output.days >= 1


async def test_agents_sdk_runs_its_shell_and_apply_patch_tools_for_the_model(agent_world):
    """The SDK's own built-in tools that run on the client (``{"type": "shell"}``,
    ``{"type": "apply_patch"}``), the simulator told which to call."""
    agents = agent_world.agents
    ran: list[list[str]] = []
    edits: list[tuple[str, str, str | None]] = []

    def run_commands(request: Any) -> str:
        ran.append(list(request.data.action.commands))
        return "steno-shell-output"

    class Editor:
        def create_file(self, operation: Any) -> str:
            edits.append((operation.type, operation.path, operation.diff))
            return f"created {operation.path}"

        update_file = delete_file = create_file

    clerk = agent_world.agent(tools=False).clone(tools=[agents.ShellTool(executor=run_commands),
                                                        agents.ApplyPatchTool(editor=Editor())])
    shell = await agents.Runner.run(clerk, 'steno-simulator: call shell {"commands": ["echo hi", "pwd"]}',
                                    run_config=agent_world.run_config)
    assert ran == [["echo hi", "pwd"]]
    assert shell.raw_responses[0].output[-1].type == "shell_call"
    assert shell.final_output.startswith(REPLY + "the tool returned") and "steno-shell-output" in shell.final_output
    patch = {"type": "create_file", "path": "notes.txt", "diff": "+hello\n"}
    patched = await agents.Runner.run(clerk, f"steno-simulator: call apply_patch {json.dumps(patch)}",
                                      run_config=agent_world.run_config)
    assert edits == [("create_file", "notes.txt", "+hello\n")]
    assert patched.raw_responses[0].output[-1].type == "apply_patch_call"
    assert "created notes.txt" in patched.final_output


# --- LiteLLM -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def litellm(outside_attempts) -> Iterator[ModuleType]:
    import litellm

    quiet_before = litellm.suppress_debug_info
    # LiteLLM prints a "give feedback" banner on every error, expected ones included.
    litellm.suppress_debug_info = True
    yield litellm
    litellm.suppress_debug_info = quiet_before


@pytest.fixture
def litellm_target(stack) -> dict[str, Any]:
    return {"model": f"openai/{MODEL}", "api_base": stack.base_url, "api_key": stack.keys["a"], "timeout": TIMEOUT_S}


def _run_the_call(call: Any, ran_for: list[str]) -> dict[str, str]:
    order_id = json.loads(call.arguments)["order_id"]
    ran_for.append(order_id)
    return {"type": "function_call_output", "call_id": call.call_id, "output": shipping_status(order_id)}


def test_litellm_runs_a_local_tool_and_answers_with_its_result(litellm, litellm_target):
    ran_for: list[str] = []
    asked = litellm.responses(input="L-2001", tools=[ORDER_TOOL], **litellm_target)
    call = asked.output[-1]
    assert call.type == "function_call" and call.name == "look_up_order"
    # The whole conversation sent back, as a client that keeps its own history does.
    history = [{"role": "user", "content": "L-2001"}, call.model_dump(exclude_none=True),
               _run_the_call(call, ran_for)]
    answered = litellm.responses(input=history, tools=[ORDER_TOOL], **litellm_target)
    assert ran_for == ["L-2001"]
    assert answered.output_text == REPLY + "the tool returned " + shipping_status("L-2001")


# LiteLLM's own success logging puts a chat-completions usage into the Responses object
# it then dumps, and pydantic warns about the mismatch; the stream itself is untouched.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_litellm_streams_text_that_assembles_into_the_final_response(litellm, litellm_target):
    streaming_target = {**litellm_target, "model": f"openai/{STREAMING_MODEL}"}
    stream = await litellm.aresponses(input="stream this to me", stream=True, **streaming_target)
    deltas: list[str] = []
    completed = None
    async for event in stream:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.completed":
            completed = event.response
    assert len(deltas) > 1
    assert completed is not None
    assert "".join(deltas) == completed.output_text == REPLY + "stream this to me"


def test_litellm_chains_the_tool_output_onto_the_turn_that_asked_for_it(litellm, litellm_target):
    ran_for: list[str] = []
    asked = litellm.responses(input="L-2002", tools=[ORDER_TOOL], **litellm_target)
    tool_output = _run_the_call(asked.output[-1], ran_for)
    # LiteLLM hands out ids of its own that encode the server's: it must map them back.
    answered = litellm.responses(input=[tool_output], previous_response_id=asked.id, tools=[ORDER_TOOL],
                                 **litellm_target)
    assert answered.output_text == REPLY + "the tool returned " + shipping_status("L-2002")
    # Without the first turn the same output answers no call.
    with pytest.raises(litellm.BadRequestError):
        litellm.responses(input=[tool_output], tools=[ORDER_TOOL], **litellm_target)


def test_litellm_without_storage_answers_and_keeps_nothing(litellm, litellm_target):
    ran_for: list[str] = []
    asked = litellm.responses(input="L-2003", tools=[ORDER_TOOL], store=False, **litellm_target)
    call = asked.output[-1]
    history = [{"role": "user", "content": "L-2003"}, call.model_dump(exclude_none=True),
               _run_the_call(call, ran_for)]
    answered = litellm.responses(input=history, tools=[ORDER_TOOL], store=False, **litellm_target)
    assert answered.output_text == REPLY + "the tool returned " + shipping_status("L-2003")
    lookup = {key: value for key, value in litellm_target.items() if key != "model"}
    for response in (asked, answered):
        with pytest.raises(litellm.NotFoundError):
            litellm.get_responses(response_id=response.id, custom_llm_provider="openai", **lookup)


def test_litellm_gets_a_structured_answer_matching_the_schema(litellm, litellm_target):
    text_format = {"type": "json_schema", "name": "delivery", "strict": True,
                   "schema": {**Delivery.model_json_schema(), "additionalProperties": False}}
    answered = litellm.responses(input="L-2004", text={"format": text_format}, **litellm_target)
    delivery = Delivery.model_validate_json(answered.output_text)
    assert delivery.order_id == REPLY + "L-2004"


# --- langchain-openai --------------------------------------------------------------------


@pytest.fixture(scope="module")
def langchain(outside_attempts) -> ModuleType:
    import langchain_openai

    return langchain_openai


class LangChainWorld:
    """ChatOpenAI on the Responses API pointed at the stack, and the order tool as a
    LangChain tool that records what it was asked."""

    def __init__(self, langchain: ModuleType, stack: Any) -> None:
        from langchain_core.tools import tool

        self.langchain = langchain
        self.stack = stack
        self.tool_ran_for: list[str] = []

        @tool
        def look_up_order(order_id: str) -> str:
            """Look up where an order is."""
            self.tool_ran_for.append(order_id)
            return shipping_status(order_id)

        self.order_tool = look_up_order

    def chat(self, model: str = MODEL, **options: Any) -> Any:
        return self.langchain.ChatOpenAI(model=model, base_url=self.stack.base_url, api_key=self.stack.keys["a"],
                                         use_responses_api=True, max_retries=0, timeout=TIMEOUT_S, **options)

    def tool_round_trip(self, order_id: str, **options: Any) -> tuple[Any, Any]:
        """The order tool offered, called, run, and answered: (the turn that asked, the final answer)."""
        from langchain_core.messages import HumanMessage

        with_tools = self.chat(**options).bind_tools([self.order_tool])
        conversation: list[Any] = [HumanMessage(order_id)]
        asked = with_tools.invoke(conversation)
        conversation += [asked, *(self.order_tool.invoke(call) for call in asked.tool_calls)]
        return asked, with_tools.invoke(conversation)


@pytest.fixture
def langchain_world(langchain, stack) -> LangChainWorld:
    return LangChainWorld(langchain, stack)


def test_langchain_runs_a_local_tool_and_answers_with_its_result(langchain_world):
    asked, answered = langchain_world.tool_round_trip("C-3001")
    assert [call["args"] for call in asked.tool_calls] == [{"order_id": "C-3001"}]
    assert langchain_world.tool_ran_for == ["C-3001"]
    assert answered.text == REPLY + "the tool returned " + shipping_status("C-3001")


def test_langchain_streams_text_that_assembles_into_the_final_message(langchain_world):
    chunks = list(langchain_world.chat(model=STREAMING_MODEL).stream("stream this to me"))
    assert len([chunk for chunk in chunks if chunk.text]) > 1
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert whole.text == "".join(chunk.text for chunk in chunks) == REPLY + "stream this to me"


def test_langchain_chains_the_tool_output_onto_the_turn_that_asked_for_it(langchain_world):
    # use_previous_response_id: LangChain sends only what follows its last answer (the
    # tool's output), naming the response that made the call.
    asked, answered = langchain_world.tool_round_trip("C-3002", use_previous_response_id=True)
    assert langchain_world.tool_ran_for == ["C-3002"]
    assert answered.text == REPLY + "the tool returned " + shipping_status("C-3002")
    server = langchain_world.chat().root_client.responses
    answered_id = answered.response_metadata["id"]
    assert server.retrieve(answered_id).previous_response_id == asked.response_metadata["id"]
    assert [item.type for item in server.input_items.list(answered_id).data] == ["function_call_output"]


def test_langchain_without_storage_answers_and_keeps_nothing(langchain_world):
    asked, answered = langchain_world.tool_round_trip("C-3003", store=False)
    assert langchain_world.tool_ran_for == ["C-3003"]
    assert answered.text == REPLY + "the tool returned " + shipping_status("C-3003")
    server = langchain_world.chat().root_client.responses
    for message in (asked, answered):
        with pytest.raises(openai.NotFoundError):
            server.retrieve(message.response_metadata["id"])


def test_langchain_parses_a_structured_answer_into_its_schema(langchain_world):
    delivery = langchain_world.chat().with_structured_output(Delivery).invoke("C-3004")
    assert isinstance(delivery, Delivery) and delivery.order_id == REPLY + "C-3004"
