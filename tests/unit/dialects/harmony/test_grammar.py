"""The constrained-answer grammar's shape (xgrammar itself checks it token by token in
tests/vllm/test_vllm_grammar.py, where xgrammar is installed)."""

from steno.services.dialects.harmony import grammar
from tests.harmony_samples import encoding, harmony

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def token(text: str) -> int:
    (only,) = encoding().encode(text, allowed_special="all")
    return only


def test_the_grammar_uses_harmony_token_ids():
    for name in ("CHANNEL", "MESSAGE", "END", "START", "CONSTRAIN"):
        assert getattr(grammar, name) == token(f"<|{name.lower()}|>")
    assert encoding().decode([grammar.FIRST_SPECIAL_TOKEN]) == "<|startoftext|>"
    assert encoding().decode([grammar.FIRST_SPECIAL_TOKEN - 1]) == " cocos"  # the last BPE rank
    assert encoding().decode([grammar.HARMONY_VOCAB_SIZE - 1]) == "<|reserved_201087|>"  # the last id


def test_every_special_token_text_is_banned_inside_json():
    specials = {encoding().decode([t]) for t in range(grammar.FIRST_SPECIAL_TOKEN, grammar.HARMONY_VOCAB_SIZE)}
    banned = tuple(grammar.SPECIAL_TEXTS)
    assert all(text.startswith(banned) for text in specials)


def test_final_scope_frames_the_answer_and_whole_scope_is_the_json_alone():
    final = harmony().answer_grammar(SCHEMA, "final", None)
    analysis, answer = final["format"]["elements"]
    assert analysis["type"] == "optional"
    assert answer["elements"][-1] == {"type": "json_schema", "json_schema": SCHEMA, "excludes": grammar.SPECIAL_TEXTS}
    whole = harmony().answer_grammar(SCHEMA, "whole", 3)
    assert whole == {"type": "structural_tag", "format": {"type": "json_schema", "json_schema": SCHEMA,
                                                           "excludes": grammar.SPECIAL_TEXTS, "max_whitespace_cnt": 3}}
