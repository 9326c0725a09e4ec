"""Small values that satisfy a constraint, for the simulator (pure): an instance of a JSON
schema, a string a regular expression matches, a sentence of a Lark grammar.

Each is the shortest (or nearly) the constraint allows, with one exception: strings the
schema leaves free carry a text the caller gives, so that a simulated answer says
something. What the readers do not understand (lookarounds, a grammar's templates,
``not``) they skip; the result may then not satisfy the constraint, and the callers say
so where they document the simulator."""

from __future__ import annotations

import math
import re
import re._constants as sre  # type: ignore[import-not-found]
import re._parser as sre_parse  # type: ignore[import-not-found]
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# Recursive schemas and grammars are cut here.
_MAX_DEPTH = 24
_STRING_FORMATS = {
    "date-time": "1970-01-01T00:00:00Z",
    "date": "1970-01-01",
    "time": "00:00:00Z",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "hostname": "example.com",
}


def schema_instance(schema: Any, text: str, root: Any = None, depth: int = 0) -> Any:
    """A small instance of the JSON ``schema``; free strings are ``text``, free numbers
    its length."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None if schema is False else {}
    if isinstance(schema.get("$ref"), str):
        target = _resolve(root, schema["$ref"])
        rest = {key: value for key, value in schema.items() if key != "$ref"}
        return schema_instance({**target, **rest} if isinstance(target, dict) else rest, text, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for combinator in ("anyOf", "oneOf"):
        options = schema.get(combinator)
        if isinstance(options, list) and options:
            # A nullable field gets its value, not null: an answer that says something.
            chosen = next((option for option in options if not _is_null(option)), options[0])
            rest = {key: value for key, value in schema.items() if key != combinator}
            return schema_instance({**rest, **chosen} if isinstance(chosen, dict) else rest, text, root, depth + 1)
    if isinstance(schema.get("allOf"), list):
        merged = {key: value for key, value in schema.items() if key != "allOf"}
        for part in schema["allOf"]:
            if isinstance(part, dict):
                merged = _merge(merged, part)
        return schema_instance(merged, text, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((name for name in kind if name != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else None
    if kind == "object":
        return _object(schema, text, root, depth)
    if kind == "array":
        prefix: list[Any] = schema["prefixItems"] if isinstance(schema.get("prefixItems"), list) else []
        count = max(int(schema.get("minItems", 0)), len(prefix))
        items = [schema_instance(prefix[i] if i < len(prefix) else schema.get("items", {}), text, root, depth + 1)
                 for i in range(count)]
        return items
    if kind == "string":
        return _string(schema, text)
    if kind in ("integer", "number"):
        return _number(schema, len(text), integer=kind == "integer")
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return {}


def _is_null(option: Any) -> bool:
    return isinstance(option, dict) and option.get("type") == "null"


def _merge(into: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    merged = {**into, **part}
    if "properties" in into and "properties" in part:
        merged["properties"] = {**into["properties"], **part["properties"]}
    if "required" in into and "required" in part:
        merged["required"] = [*into["required"], *part["required"]]
    return merged


def _resolve(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        return {}
    node = root
    for step in ref[1:].split("/")[1:]:
        step = step.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and step in node:
            node = node[step]
        elif isinstance(node, list) and step.isdigit() and int(step) < len(node):
            node = node[int(step)]
        else:
            return {}
    return node


def _object(schema: dict[str, Any], text: str, root: Any, depth: int) -> dict[str, Any]:
    properties: dict[str, Any] = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
    required = [name for name in schema.get("required", []) if isinstance(name, str)]
    value = {name: schema_instance(properties.get(name, {}), text, root, depth + 1) for name in required}
    for name, subschema in properties.items():
        if len(value) >= int(schema.get("minProperties", 0)):
            break
        value.setdefault(name, schema_instance(subschema, text, root, depth + 1))
    return value


def _string(schema: dict[str, Any], text: str) -> str:
    if isinstance(schema.get("pattern"), str):
        matched = regex_example(schema["pattern"], search=True)
        if matched is not None:
            return matched
    value = _STRING_FORMATS.get(str(schema.get("format")), text)
    value = value[: int(schema["maxLength"])] if "maxLength" in schema else value
    return value + "x" * max(0, int(schema.get("minLength", 0)) - len(value))


def _number(schema: dict[str, Any], preferred: int, integer: bool) -> int | float:
    low = -math.inf
    if isinstance(schema.get("minimum"), (int, float)):
        low = schema["minimum"]
    if isinstance(schema.get("exclusiveMinimum"), (int, float)):
        low = max(low, schema["exclusiveMinimum"] + (1 if integer else 1e-9))
    high = math.inf
    if isinstance(schema.get("maximum"), (int, float)):
        high = schema["maximum"]
    if isinstance(schema.get("exclusiveMaximum"), (int, float)):
        high = min(high, schema["exclusiveMaximum"] - (1 if integer else 1e-9))
    value: int | float = min(max(preferred, low), high)
    step = schema.get("multipleOf")
    if isinstance(step, (int, float)) and step > 0:
        value = math.ceil(value / step) * step
    if integer:
        return math.ceil(value) if value == value else 0
    return value


def regex_example(pattern: str, search: bool = False) -> str | None:
    """A short string ``pattern`` matches in full (``search``: anywhere, as JSON Schema's
    ``pattern`` does); None when none is found."""
    try:
        parsed = sre_parse.parse(pattern)
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return None
    groups: dict[int, str] = {}
    try:
        example = "".join(_regex_part(parsed, groups))
    except _Unsupported:
        return None
    matches = compiled.search(example) if search else compiled.fullmatch(example)
    return example if matches else None


class _Unsupported(Exception):
    pass


# Characters tried, in order, for a class or a wildcard.
_CANDIDATES = "a0 A_-.x1/\n"
_CATEGORIES: dict[Any, Callable[[str], bool]] = {
    sre.CATEGORY_DIGIT: str.isdigit,
    sre.CATEGORY_NOT_DIGIT: lambda char: not char.isdigit(),
    sre.CATEGORY_SPACE: str.isspace,
    sre.CATEGORY_NOT_SPACE: lambda char: not char.isspace(),
    sre.CATEGORY_WORD: lambda char: char.isalnum() or char == "_",
    sre.CATEGORY_NOT_WORD: lambda char: not (char.isalnum() or char == "_"),
}


def _in_class(char: str, items: list[tuple[Any, Any]]) -> bool:
    negate = bool(items) and items[0][0] is sre.NEGATE
    hit = False
    for op, arg in items[1:] if negate else items:
        if op is sre.LITERAL:
            hit = hit or ord(char) == arg
        elif op is sre.RANGE:
            hit = hit or arg[0] <= ord(char) <= arg[1]
        elif op is sre.CATEGORY:
            hit = hit or _CATEGORIES.get(arg, lambda _: False)(char)
    return hit != negate


def _class_char(items: list[tuple[Any, Any]]) -> str:
    firsts = [chr(arg) if op is sre.LITERAL else chr(arg[0]) if op is sre.RANGE else ""
              for op, arg in items if op is not sre.NEGATE]
    for char in [*firsts, *_CANDIDATES]:
        if char and _in_class(char, items):
            return char
    raise _Unsupported


def _regex_part(parsed: Any, groups: dict[int, str]) -> Iterator[str]:
    for op, arg in parsed:
        if op is sre.LITERAL:
            yield chr(arg)
        elif op is sre.NOT_LITERAL:
            yield next(char for char in _CANDIDATES if ord(char) != arg)
        elif op is sre.ANY:
            yield "a"
        elif op is sre.IN:
            yield _class_char(arg)
        elif op is sre.CATEGORY:
            yield _class_char([(op, arg)])
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", None)):
            low, _high, inner = arg
            yield "".join("".join(_regex_part(inner, groups)) for _ in range(low))
        elif op is sre.SUBPATTERN:
            group, _add, _del, inner = arg
            text = "".join(_regex_part(inner, groups))
            if group is not None:
                groups[group] = text
            yield text
        elif op is sre.ATOMIC_GROUP:
            yield "".join(_regex_part(arg, groups))
        elif op is sre.BRANCH:
            yield min(("".join(_regex_part(option, dict(groups))) for option in arg[1]), key=len)
        elif op is sre.GROUPREF:
            yield groups.get(arg, "")
        elif op in (sre.AT, sre.ASSERT, sre.ASSERT_NOT):
            continue
        else:
            raise _Unsupported


# Lark's common terminals (``%import common.X``), each as a short sentence of it.
_LARK_COMMON = {
    "LF": "\n", "CR": "\r", "NEWLINE": "\n", "WS": " ", "WS_INLINE": " ", "DIGIT": "0", "HEXDIGIT": "0",
    "INT": "0", "SIGNED_INT": "0", "DECIMAL": "0.0", "FLOAT": "0.0", "NUMBER": "0", "SIGNED_NUMBER": "0",
    "LETTER": "a", "LCASE_LETTER": "a", "UCASE_LETTER": "A", "WORD": "a", "CNAME": "a", "ESCAPED_STRING": '""',
    "SH_COMMENT": "#", "CPP_COMMENT": "//",
}
_LARK_TOKEN = re.compile(r"""
    (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?:[^/\\\n]|\\.)+/[imslux]*)
  | (?P<comment>//.*)
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<range>\.\.)
  | (?P<alias>->\s*[A-Za-z_][A-Za-z_0-9]*)
  | (?P<repeat>~\s*\d+(?:\s*\.\.\s*\d+)?)
  | (?P<op>[()\[\]|?*+])
  | (?P<space>\s+)
""", re.X)


@dataclass(frozen=True)
class _Lit:
    text: str


@dataclass(frozen=True)
class _Ref:
    name: str


@dataclass(frozen=True)
class _Choice:
    options: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class _Repeat:
    inner: Any
    low: int


def lark_example(grammar: str, start: str = "start") -> str | None:
    """A short sentence of the Lark ``grammar`` from ``start``; None when the grammar
    cannot be read."""
    try:
        rules = _lark_rules(grammar)
        if start not in rules:
            return None
        lengths = _shortest_lengths(rules)
        if math.isinf(lengths.get(start, math.inf)):
            return None
        return _derive(_Ref(start), rules, lengths)
    except (_Unsupported, ValueError, RecursionError):
        return None


def _lark_rules(grammar: str) -> dict[str, _Choice]:
    definitions: list[list[str]] = []
    rules: dict[str, _Choice] = {}
    for line in grammar.splitlines():
        stripped = line.rstrip()
        if not stripped.strip() or stripped.lstrip().startswith("//"):
            continue
        if stripped.lstrip().startswith("%import"):
            for name in re.findall(r"[A-Z_][A-Z_0-9]*", stripped.split("common", 1)[-1]):
                if name in _LARK_COMMON:
                    rules[name] = _Choice(((_Lit(_LARK_COMMON[name]),),))
            continue
        if stripped.lstrip().startswith("%"):
            continue
        head = re.match(r"^\s*[?!]?([A-Za-z_][A-Za-z_0-9]*)(?:\.-?\d+)?\s*:(?!:)(.*)$", stripped)
        if head and not stripped.lstrip().startswith("|"):
            definitions.append([head.group(1), head.group(2)])
        elif definitions:
            definitions[-1][1] += " " + stripped
        else:
            raise _Unsupported
    for name, body in definitions:
        rules[name] = _parse_expansions(list(_lark_tokens(body)), 0)[0]
    return rules


def _lark_tokens(body: str) -> Iterator[tuple[str, str]]:
    position = 0
    while position < len(body):
        found = _LARK_TOKEN.match(body, position)
        if found is None:
            raise _Unsupported
        position = found.end()
        kind = found.lastgroup or ""
        if kind not in ("space", "alias", "comment"):
            yield kind, found.group()


def _parse_expansions(tokens: list[tuple[str, str]], at: int) -> tuple[_Choice, int]:
    options: list[tuple[Any, ...]] = []
    current: list[Any] = []
    while at < len(tokens):
        kind, text = tokens[at]
        if text in (")", "]"):
            break
        at += 1
        if text == "|":
            options.append(tuple(current))
            current = []
        elif text in ("(", "["):
            inner, at = _parse_expansions(tokens, at)
            at += 1  # the closing bracket
            current.append(_Repeat(inner, 0) if text == "[" else inner)
        elif text in ("?", "*") and current:
            current[-1] = _Repeat(current[-1], 0)
        elif text == "+" and current:
            current[-1] = _Repeat(current[-1], 1)
        elif kind == "repeat" and current:
            current[-1] = _Repeat(current[-1], int(re.findall(r"\d+", text)[0]))
        elif kind == "range":
            at += 1  # "a".."z" stands for its first letter, already taken
        elif kind == "string":
            current.append(_Lit(_lark_literal(text)))
        elif kind == "regex":
            body, _, flags = text[1:].rpartition("/")
            example = regex_example(f"(?{flags})" + body if flags else body)
            if example is None:
                raise _Unsupported
            current.append(_Lit(example))
        elif kind == "name":
            current.append(_Ref(text))
        else:
            raise _Unsupported
    options.append(tuple(current))
    return _Choice(tuple(options)), at


def _lark_literal(text: str) -> str:
    literal = text[:-1] if text.endswith("i") else text
    return literal[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")


def _cost(part: Any, lengths: dict[str, float]) -> float:
    if isinstance(part, _Lit):
        return len(part.text)
    if isinstance(part, _Ref):
        return lengths.get(part.name, math.inf)
    if isinstance(part, _Repeat):
        return 0 if part.low == 0 else part.low * _cost(part.inner, lengths)
    return min(sum(_cost(item, lengths) for item in option) for option in part.options)


def _shortest_lengths(rules: dict[str, _Choice]) -> dict[str, float]:
    """The length of each rule's shortest sentence (a fixed point: rules refer to each
    other)."""
    lengths = dict.fromkeys(rules, math.inf)
    changed = True
    while changed:
        changed = False
        for name, rule in rules.items():
            cost = _cost(rule, lengths)
            if cost < lengths[name]:
                lengths[name], changed = cost, True
    return lengths


def _derive(part: Any, rules: dict[str, _Choice], lengths: dict[str, float], depth: int = 0) -> str:
    if depth > 4 * _MAX_DEPTH:
        raise _Unsupported
    if isinstance(part, _Lit):
        return part.text
    if isinstance(part, _Ref):
        if part.name not in rules:
            raise _Unsupported
        return _derive(rules[part.name], rules, lengths, depth + 1)
    if isinstance(part, _Repeat):
        return "".join(_derive(part.inner, rules, lengths, depth + 1) for _ in range(part.low))
    option = min(part.options, key=lambda items: sum(_cost(item, lengths) for item in items))
    return "".join(_derive(item, rules, lengths, depth + 1) for item in option)
