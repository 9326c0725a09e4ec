# ruff: noqa: RUF001 (DeepSeek's markers are written with full-width bars)
import dataclasses

import pytest

from steno.services.dialects.chat_template.families import FAMILIES, family_for_model
from steno.services.dialects.chat_template.template import render_chat
from steno.services.dialects.chat_template.vocabulary import IncrementalDecoder, byte_level_tokenizer

TOOL_FORMATS = {"hermes", "llama3_json", "mistral", "qwen3_coder", "deepseek_v3"}

QWEN3_TEMPLATE = FAMILIES["qwen3"].template()
# Excerpts of the models' own templates: what family_for_model looks at.
QWEN3_CODER_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}<function>\n<name>{{ tool.name }}</name>"
    "{% endfor %}</tools>\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n</function>\n</tool_call>{%- endif %}"
)
QWEN25_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{{ tools | tojson }}</tools>\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n{%- endif %}'
)
HERMES3_TEMPLATE = (
    "{{bos_token}}{%- for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{%- endfor %}{% if tools %}<tool_call>\n{\"name\": <function-name>}\n</tool_call>{% endif %}"
)
LLAMA31_TEMPLATE = (
    "{{- bos_token }}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{%- if builtin_tools is defined %}"
    "{{- '<|python_tag|>' }}{%- endif %}{{- '<|eot_id|>' }}"
)
MISTRAL_TEMPLATE = "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }}[/INST][TOOL_CALLS]{% endfor %}"
DEEPSEEK_TEMPLATE = "{{ bos_token }}{% for m in messages %}<｜User｜>{{ m.content }}<｜Assistant｜>{% endfor %}"


@pytest.mark.parametrize(("config", "tokenizer_config", "family", "tool_format"), [
    ({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, {"chat_template": QWEN3_TEMPLATE},
     "qwen3", "hermes"),
    ({"model_type": "qwen3_moe"}, {"chat_template": QWEN3_TEMPLATE}, "qwen3", "hermes"),
    ({"model_type": "qwen2"}, {"chat_template": QWEN25_TEMPLATE}, "qwen3", "hermes"),
    ({"model_type": "qwen3_moe"}, {"chat_template": QWEN3_CODER_TEMPLATE}, "qwen3", "qwen3_coder"),
    ({"model_type": "llama"}, {"chat_template": LLAMA31_TEMPLATE}, "llama3", "llama3_json"),
    ({"model_type": "llama"}, {}, "llama3", "llama3_json"),
    ({"architectures": ["LlamaForCausalLM"]}, {}, "llama3", "llama3_json"),
    ({"model_type": "mistral"}, {"chat_template": MISTRAL_TEMPLATE}, "mistral", "mistral"),
    ({"model_type": "mixtral"}, {}, "mistral", "mistral"),
    ({"model_type": "deepseek_v3"}, {"chat_template": DEEPSEEK_TEMPLATE}, "deepseek", "deepseek_v3"),
    ({"model_type": "deepseek_v2"}, {}, "deepseek", "deepseek_v3"),
    # Fine-tunes keep their base's model_type and bring their own format.
    ({"model_type": "llama"}, {"chat_template": HERMES3_TEMPLATE}, "hermes", "hermes"),
    ({"model_type": "mistral"}, {"chat_template": HERMES3_TEMPLATE}, "hermes", "hermes"),
    ({"model_type": "llama"}, {"chat_template": DEEPSEEK_TEMPLATE}, "deepseek", "deepseek_v3"),
    ({"model_type": "qwen2"}, {"chat_template": DEEPSEEK_TEMPLATE}, "deepseek", "deepseek_v3"),
    # Any other model whose template uses <tool_call> is Hermes-style.
    ({"model_type": "gemma3"}, {"chat_template": HERMES3_TEMPLATE}, "hermes", "hermes"),
    # Named templates, as some tokenizer_config.json files list them.
    ({"model_type": "phi3"}, {"chat_template": [{"name": "default", "template": "{{ x }}"},
                                                {"name": "tool_use", "template": HERMES3_TEMPLATE}]},
     "hermes", "hermes"),
])
def test_family_for_model(config, tokenizer_config, family, tool_format):
    found = family_for_model(config, tokenizer_config)
    assert found is not None
    assert (found.name, found.tool_call_format) == (family, tool_format)


def test_qwen3_coder_is_qwen3_with_its_own_tool_format():
    found = family_for_model({"model_type": "qwen3_moe"}, {"chat_template": QWEN3_CODER_TEMPLATE})
    assert found == dataclasses.replace(FAMILIES["qwen3"], tool_call_format="qwen3_coder")


def test_unknown_models_have_no_family():
    assert family_for_model({}, {}) is None
    assert family_for_model({"model_type": "gemma3"}, {"chat_template": "<start_of_turn>user\n{{ x }}"}) is None
    assert family_for_model({"model_type": "gpt_oss"}, {"chat_template": None}) is None


def test_family_fields_are_consistent():
    assert set(FAMILIES) == {"hermes", "llama3", "mistral", "qwen3", "deepseek"}
    for name, family in FAMILIES.items():
        assert family.name == name and family.template_file == f"{name}.jinja"
        assert family.tool_call_format in TOOL_FORMATS
        assert family.eos_token in family.stop_tokens
        markers = {family.eos_token, *family.stop_tokens, *(family.reasoning or ()),
                   *([family.bos_token] if family.bos_token else [])}
        assert markers <= set(family.special_tokens)
        assert len(set(family.special_tokens)) == len(family.special_tokens)


def test_every_special_token_is_one_id_of_its_byte_level_tokenizer():
    for family in FAMILIES.values():
        tokenizer = byte_level_tokenizer(family.special_tokens)
        for index, token in enumerate(family.special_tokens):
            assert tokenizer.encode(token, add_special_tokens=False).ids == [index]
            assert tokenizer.encode(f"a{token}b", add_special_tokens=False).ids[1] == index


def test_reasoning_effort_becomes_template_arguments():
    qwen3, deepseek = FAMILIES["qwen3"], FAMILIES["deepseek"]
    assert qwen3.template_kwargs(None) == {}
    assert qwen3.template_kwargs("none") == {"enable_thinking": False}
    assert qwen3.template_kwargs("low") == qwen3.template_kwargs("high") == {"enable_thinking": True}
    assert deepseek.template_kwargs("none") == {"thinking": False}
    assert deepseek.template_kwargs("medium") == {"thinking": True}
    for name in ("hermes", "llama3", "mistral"):
        assert FAMILIES[name].template_kwargs("high") == {}
        assert FAMILIES[name].reasoning is None
    assert qwen3.reasoning == deepseek.reasoning == ("<think>", "</think>")


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_000000001", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_000000001", "name": "get_weather", "content": "21 C"},
    {"role": "assistant", "content": "It is 21 C."},
    {"role": "user", "content": "Thanks!"},
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_template_renders_with_its_own_tokens(name):
    family = FAMILIES[name]
    tokens = {"eos_token": family.eos_token}
    if family.bos_token is not None:
        tokens["bos_token"] = family.bos_token
    text = render_chat(family.template(), CONVERSATION, tools=TOOLS, special_tokens=tokens,
                       **family.template_kwargs("medium"))
    if family.bos_token is not None:
        assert text.startswith(family.bos_token)
    # The finished assistant turn is closed by the family's end of turn.
    assert f"It is 21 C.{family.eos_token}" in text
    # The prompt encodes with the markers as single tokens, and decodes back whole.
    tokenizer = byte_level_tokenizer(family.special_tokens)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.token_to_id(family.eos_token) in ids
    decoder = IncrementalDecoder(tokenizer)
    assert "".join(decoder.feed(ids[i:i + 3]) for i in range(0, len(ids), 3)) + decoder.finish() == text
