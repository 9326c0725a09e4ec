import enum
import re
from typing import Literal

import jsonschema
import lark
import pytest
from pydantic import BaseModel, Field

from steno.services.worker.instances import lark_example, regex_example, schema_instance


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Line(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{2}-\d{3}$")
    count: int = Field(ge=2, le=9)
    price: float = Field(gt=0.5, multiple_of=0.25)


class Order(BaseModel):
    lines: list[Line] = Field(min_length=2)
    colour: Colour
    note: str | None
    mode: Literal["fast", "slow"]
    parent: "Order | None" = None
    tags: tuple[str, int]


SCHEMAS = [
    Order.model_json_schema(),
    {"type": "string", "minLength": 80},
    {"type": "string", "maxLength": 3},
    {"type": "string", "format": "email"},
    {"type": "integer", "exclusiveMinimum": 10, "multipleOf": 4},
    {"type": "number", "maximum": -3},
    {"type": ["null", "array"], "items": {"const": 7}, "minItems": 3},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
               {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}]},
    {"type": "object", "properties": {"x": {"type": "string"}, "y": {"type": "string"}}, "minProperties": 2},
    {"oneOf": [{"type": "null"}, {"type": "object", "properties": {"k": {"enum": [3, 4]}}, "required": ["k"]}]},
    {},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_schema_instances_are_valid(schema):
    jsonschema.validate(schema_instance(schema, "some user text"), schema)


def test_free_strings_carry_the_text_and_nullable_fields_a_value():
    instance = schema_instance(Order.model_json_schema(), "hello")
    assert instance["note"] == "hello" and instance["tags"] == ["hello", 5]


def test_recursive_schemas_end():
    tree = {"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object", "required": ["child"],
                                                         "properties": {"child": {"$ref": "#/$defs/Node"}}}}}
    depth, node = 0, schema_instance(tree, "x")
    while node:
        node, depth = node["child"], depth + 1
    assert 0 < depth < 40


@pytest.mark.parametrize("pattern", [
    r"^\d{3}-[A-Z]{2,}$", r"(foo|ba)+x?", r"[^abc]\w+@\w+\.com", r"(a)\1b", r"\s*\S+", r"(?i)hello",
    r"[\u00e9-\u00ff]{2}", r"(?:ab){3}|c", r"a*?b+?", r"(?P<w>x)(?P=w)",
])
def test_regex_examples_match(pattern):
    example = regex_example(pattern)
    assert example is not None and re.fullmatch(pattern, example)


def test_regex_examples_are_short_and_unreadable_ones_are_none():
    assert regex_example(r"a{2,100}") == "aa"
    assert regex_example(r"(") is None
    assert regex_example(r"(?=b)a") is None  # a lookahead it does not honour: no wrong answer


GRAMMARS = [
    'start: greeting+ NAME\ngreeting: ("hi" | "hello") " "\nNAME: /[A-Z][a-z]+/',
    'start: expr\n?expr: term (("+" | "-") term)*\n?term: NUMBER | "(" expr ")"\n%import common.NUMBER',
    'start: list\nlist: "[" [item ("," item)*] "]"\nitem: list | ESCAPED_STRING  // nested\n'
    "%import common.ESCAPED_STRING",
    'start: a b\na.2: "x"~3\nb: "y"i | "a".."f"',
]


@pytest.mark.parametrize("grammar", GRAMMARS)
def test_lark_examples_parse(grammar):
    example = lark_example(grammar)
    assert example is not None
    lark.Lark(grammar).parse(example)


def test_a_codex_style_patch_grammar_gives_a_patch():
    grammar = '''
start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?
hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change?
filename: /(.+)/
add_line: "+" /(.*)/ LF -> line
change: (change_context | change_line)+
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
%import common.LF
'''
    example = lark_example(grammar)
    assert example is not None
    assert re.fullmatch(r"\*\*\* Begin Patch\n\*\*\* (Add|Delete) File: .+\n(\+.*\n)*\*\*\* End Patch", example)


def test_grammars_it_cannot_read_give_none():
    assert lark_example("start: undefined_rule") is None
    assert lark_example("start: start") is None  # no finite sentence
    assert lark_example("not a grammar at all") is None
