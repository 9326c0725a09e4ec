"""A chat-template model served by a vLLM worker through the whole pipeline: a tiny
random Qwen3 (its chat template, its tokenizer, built at test time), the API rendering
its prompts from the files the worker published, the parser reading its output. Random
weights say nothing meaningful; what is checked is the plumbing: the prompt rendered as
the template renders it, every token accounted for, the log re-parsed byte for byte."""

from __future__ import annotations

import time

import openai
import pytest

pytest.importorskip("vllm")

from steno.infra.tiny_model import build_tiny_qwen3
from steno.schemas.api import CreateResponseRequest
from steno.services.dialects import chat_template_dialect
from steno.services.dialects.chat_template.files import files_from_directory
from tests.conftest import reparses_identically, separate_stack
from tests.vllm.conftest import ENGINE_ARGS

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

MODEL = "tiny-qwen3"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="module")
def qwen3_stack(settings, qwen3_dir, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STENO_MODEL_FILES_DIR", str(tmp_path_factory.mktemp("model-files")))
        with separate_stack(settings, "qwen", tmp_path_factory.mktemp("qwen-logs")) as stack:
            stack.add("parser", "parser")
            stack.add("worker", "worker", "--engine", "vllm", "--model", MODEL, "--model-path", str(qwen3_dir),
                      "--dtype", ENGINE_ARGS["dtype"], "--max-model-len", str(ENGINE_ARGS["max_model_len"]),
                      "--enforce-eager", "--kv-cache-memory-bytes", str(ENGINE_ARGS["kv_cache_memory_bytes"]))
            stack.add_api()
            client = openai.OpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0, timeout=120)
            deadline = time.monotonic() + 300
            while MODEL not in {model.id for model in client.models.list()}:
                assert time.monotonic() < deadline, stack.logs()
                time.sleep(1)
            yield stack, client


@pytest.mark.parametrize("tools", [[], [WEATHER]], ids=["no-tools", "tools"])
def test_a_vllm_chat_template_model_answers_through_the_pipeline(qwen3_stack, qwen3_dir, tools):
    stack, client = qwen3_stack
    reply = client.responses.create(model=MODEL, input="Say something.", tools=tools, max_output_tokens=24,
                                    temperature=1.0)
    assert reply.status in ("completed", "incomplete")
    # The prompt is the template's rendering, token for token.
    expected = chat_template_dialect(files_from_directory(qwen3_dir)).render(
        CreateResponseRequest(model=MODEL, input="Say something.", tools=tools), int(reply.created_at))
    assert reply.usage.input_tokens == len(expected.token_ids)
    assert 0 < reply.usage.output_tokens <= 24
    assert reparses_identically(stack.settings, reply.id)
