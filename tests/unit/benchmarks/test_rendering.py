from steno.benchmarks.rendering import conversation, measure
from steno.schemas.api import CreateResponseRequest
from steno.services.dialects import chat_template_dialect
from steno.services.dialects.chat_template.families import FAMILIES
from steno.services.dialects.chat_template.files import files_for_family


def test_a_measure_renders_the_conversation_and_its_next_turn():
    items = conversation(turns=2, words=5)
    assert [item["role"] for item in items] == ["user", "assistant"] * 2
    first = CreateResponseRequest(model="m", input=[*items, {"type": "message", "role": "user", "content": "next?"}])
    dialect = chat_template_dialect(files_for_family(FAMILIES["qwen3"]))
    cold, warm, tokens = measure(lambda: dialect, first, rounds=2)
    assert tokens == len(dialect.render(first, 0).token_ids) > 0
    assert cold > 0 and warm > 0
