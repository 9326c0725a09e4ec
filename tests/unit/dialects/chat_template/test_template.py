# ruff: noqa: RUF001 (DeepSeek's markers are written with full-width bars)
import json
from datetime import datetime

import pytest

from steno.services.dialects.chat_template import template as template_module
from steno.services.dialects.chat_template.families import FAMILIES, Family
from steno.services.dialects.chat_template.template import TemplateError, render_chat, supported_roles

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Météo d'une ville.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."}},
                   "required": ["city"]}}}
CALL_ID = "call_abc123456"
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": CALL_ID, "name": "get_weather", "content": '{"temp": 21}'},
]
QUESTION = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}]


def tokens(family: Family) -> dict[str, str]:
    found = {"eos_token": family.eos_token}
    if family.bos_token is not None:
        found["bos_token"] = family.bos_token
    return found


def render(name: str, messages=CONVERSATION, **kwargs) -> str:
    family = FAMILIES[name]
    return render_chat(family.template(), messages, tools=[WEATHER], special_tokens=tokens(family),
                       date_string="01 Jan 2026", **kwargs)


def dumped(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def test_every_stored_template_names_its_source_first():
    for family in FAMILIES.values():
        first = family.template().splitlines()[0]
        assert first.startswith("{#- Source: ") and " at " in first and first.endswith(" -#}")


def test_qwen3_chatml_tools_call_and_response():
    text = render("qwen3")
    assert text.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    assert f"<tools>\n{dumped(WEATHER)}\n</tools>" in text  # non-ASCII kept as it is
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' \
        '<|im_end|>' in text
    assert '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_qwen3_thinking_switch_in_the_generation_prompt():
    assert render("qwen3", enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render("qwen3", enable_thinking=True).endswith("<|im_start|>assistant\n")
    assert render("qwen3", **FAMILIES["qwen3"].template_kwargs("none")).endswith("</think>\n\n")


def test_qwen3_replays_reasoning_of_a_tool_loop_under_way():
    messages = [*CONVERSATION[:2], {**CONVERSATION[2], "reasoning_content": "Need the weather."}, CONVERSATION[3]]
    assert "<|im_start|>assistant\n<think>\nNeed the weather.\n</think>\n\n<tool_call>" in render("qwen3", messages)


def test_hermes_tools_call_and_response():
    text = render("hermes")
    assert text.startswith("<s>You are a function calling AI model.")
    assert "<tools> " in text and '"parameters": ' + dumped(WEATHER["function"]["parameters"]) in text
    assert "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n" in text
    assert '<|im_start|>assistant\n<tool_call>\n{ "arguments": {"city": "Paris"}, "name": "get_weather"}\n' \
        '</tool_call> <|im_end|>' in text
    assert '<|im_start|>tool\n<tool_response>\n{"name": "get_weather", "content": "{\\"temp\\": 21}"}\n' \
        '</tool_response> <|im_end|>\n' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_llama3_json_tools_call_and_ipython_result():
    text = render("llama3")
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n")
    assert "Today Date: 01 Jan 2026\n\nYou are terse.<|eot_id|>" in text
    # The tools go with the first user message, indented as the template writes them.
    user = text.index("<|start_header_id|>user<|end_header_id|>\n\n")
    assert text.index(json.dumps(WEATHER, ensure_ascii=False, indent=4)) > user
    assert '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}' \
        '<|eot_id|>' in text
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n{"output": "{\\"temp\\": 21}"}<|eot_id|>' in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_llama3_prints_today_when_no_date_is_given():
    family = FAMILIES["llama3"]
    text = render_chat(family.template(), QUESTION, special_tokens=tokens(family))
    assert f"Today Date: {datetime.now().strftime('%d %b %Y')}" in text


def test_mistral_tools_calls_and_results():
    text = render("mistral")
    assert text.startswith('<s>[AVAILABLE_TOOLS] [{"type": "function", "function": {"name": "get_weather", ')
    assert "[/AVAILABLE_TOOLS][INST] Weather in Paris?[/INST]" in text
    # The template keeps the last nine characters of a call id.
    assert '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123456"}]</s>' in text
    assert text.endswith('[TOOL_RESULTS] {"content": {"temp": 21}, "call_id": "abc123456"}[/TOOL_RESULTS]')


def test_mistral_puts_the_system_message_in_the_last_user_turn():
    text = render("mistral", QUESTION)
    assert text.endswith("\n\nYou are terse.\n\nWeather in Paris?[/INST]")


def test_deepseek_tools_call_and_outputs():
    text = render("deepseek")
    assert text.startswith("<｜begin▁of▁sentence｜>You are terse.\n\nYou are a helpful assistant with tool calling")
    assert f"\n```json\n{dumped(WEATHER)}\n```\n" in text
    assert "<｜User｜>Weather in Paris?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function" \
        '<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>' \
        "<｜end▁of▁sentence｜>" in text
    # After a tool's output the model goes on with its turn: no new assistant header.
    assert text.endswith('<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{"temp": 21}<｜tool▁output▁end｜>'
                         "<｜tool▁outputs▁end｜>")
    assert render("deepseek", QUESTION).endswith("<｜User｜>Weather in Paris?<｜Assistant｜>")


@pytest.mark.parametrize(("name", "roles"), [
    ("hermes", {"system"}),
    # Llama 3's template writes any role as a header of its own.
    ("llama3", {"system", "developer"}),
    ("mistral", {"system"}),
    ("qwen3", {"system"}),
    ("deepseek", {"system"}),
])
def test_supported_roles_of_the_stored_templates(name, roles):
    family = FAMILIES[name]
    assert supported_roles(family.template(), tokens(family)) == roles


STRICT = (
    "{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + m.role) }}{% endif %}<{{ m.role }}>{{ m.content }}{% endfor %}"
)
NO_SYSTEM = (
    "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% elif m.role == 'user' %}[user]{{ m.content }}{% endif %}{% endfor %}"
)


def test_supported_roles_by_rendering_not_by_reading():
    assert supported_roles(STRICT) == {"system"}
    assert supported_roles(NO_SYSTEM) == frozenset()
    # Mentions both roles, renders neither.
    assert supported_roles("{# system developer #}{% for m in messages if m.role == 'user' %}{{ m.content }}"
                           "{% endfor %}") == frozenset()


def test_supported_roles_needs_the_tokens_the_template_concatenates():
    template = "{% for m in messages %}{{ m.content + eos_token }}{% endfor %}"
    assert supported_roles(template) == frozenset()
    assert supported_roles(template, {"eos_token": "</s>"}) == {"system", "developer"}


def test_raise_exception_surfaces_as_template_error():
    with pytest.raises(TemplateError) as raised:
        render_chat(STRICT, [{"role": "tool", "content": "x"}])
    assert raised.value.message == "Unknown role: tool"
    # Llama 3's template refuses parallel calls.
    calls = [{**CONVERSATION[2]["tool_calls"][0], "id": f"call_{i}"} for i in range(2)]
    with pytest.raises(TemplateError, match="single tool-calls"):
        render("llama3", [CONVERSATION[1], {"role": "assistant", "content": "", "tool_calls": calls}])


def test_errors_while_rendering_and_compiling_are_template_errors():
    with pytest.raises(TemplateError, match="does not compile"):
        render_chat("{% if %}", QUESTION)
    with pytest.raises(TemplateError):
        supported_roles("{% for m in messages %}")
    # The sandbox is immutable: a template cannot change the caller's messages.
    with pytest.raises(TemplateError):
        render_chat("{{ messages.append(1) }}", QUESTION)
    # Concatenating an undefined token.
    with pytest.raises(TemplateError):
        render_chat("{{ 'x' + eos_token }}", QUESTION)


def test_environment_is_transformers():
    assert render_chat("{{ value | tojson }}", [], value={"b": "é<&>", "a": 1}) == '{"b": "é<&>", "a": 1}'
    assert render_chat("{{ value | tojson(indent=2, sort_keys=true) }}", [], value={"b": 1, "a": [1]}) == \
        json.dumps({"b": 1, "a": [1]}, indent=2, sort_keys=True)
    assert render_chat("{{ value | tojson(separators=(',', ':')) }}", [], value={"a": [1, 2]}) == '{"a":[1,2]}'
    assert render_chat("{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}", []) == "1"
    assert render_chat("  {% if true %}\nx\n{% endif %}", []) == "x\n"
    assert render_chat('{{ strftime_now("%Y") }}', []) == str(datetime.now().year)
    assert render_chat("{{ bos_token }}{{ add_generation_prompt }}", [], special_tokens={"bos_token": "<s>"}) == \
        "<s>True"
    # Template arguments win over special tokens of the same name, as in transformers.
    assert render_chat("{{ eos_token }}", [], special_tokens={"eos_token": "a"}, eos_token="b") == "b"


def test_empty_tools_are_no_tools():
    family = FAMILIES["llama3"]
    text = render_chat(family.template(), QUESTION, tools=[], special_tokens=tokens(family))
    assert "Environment: ipython" not in text


def test_each_template_is_compiled_once(monkeypatch):
    compiled = []
    original = template_module._ENVIRONMENT.from_string

    def counting(source):
        compiled.append(source)
        return original(source)

    monkeypatch.setattr(template_module._ENVIRONMENT, "from_string", counting)
    unique = "{# compiled once #}{% for m in messages %}{{ m.content }}{% endfor %}"
    for _ in range(3):
        assert render_chat(unique, QUESTION) == "You are terse.Weather in Paris?"
    supported_roles(unique)
    assert compiled == [unique]
