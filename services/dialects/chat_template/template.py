"""Renders Hugging Face chat templates exactly as ``transformers``' ``apply_chat_template``
does, so that a prompt built here is the prompt the model was trained on and the one
vLLM builds for the same conversation.

The environment is transformers' (``transformers/utils/chat_template_utils.py``): an
immutable sandbox with ``trim_blocks``, ``lstrip_blocks`` and the loop controls; a
``tojson`` filter that keeps non-ASCII text as it is (Jinja's own escapes HTML) and takes
``indent``, ``separators`` and ``sort_keys``; and the globals ``raise_exception`` and
``strftime_now``. The special tokens (``bos_token``, ``eos_token``, ...) are template
variables, as transformers passes its ``special_tokens_map``.

Messages and tools are in the OpenAI chat shape. A tool call's ``arguments`` are passed
as the template expects them; every stored template (``templates/``) writes them with
``tojson`` (so an object), Qwen3's also accepts a string, written as it is.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The roles a request's instructions may take; user, assistant and tool every template has.
INSTRUCTION_ROLES = ("system", "developer")

_NO_TOKENS: Mapping[str, str] = {}


class TemplateError(Exception):
    """A chat template that does not compile, or that cannot or will not render a
    conversation (its own ``raise_exception``, or a failure while rendering)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


_ENVIRONMENT = _environment()

# Errors a template can meet while rendering a conversation it does not expect: a missing
# key, a None where it concatenates text, a role it indexes past.
_RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError, ArithmeticError)


@functools.lru_cache(maxsize=64)
def _compiled(template: str) -> jinja2.Template:
    try:
        return _ENVIRONMENT.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"the chat template does not compile: {exc.message} (line {exc.lineno})") from exc


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] = _NO_TOKENS,
    **template_kwargs: Any,
) -> str:
    """The prompt text of ``messages`` (and ``tools``) under ``template``.

    ``template_kwargs`` are further template variables (``enable_thinking``,
    ``date_string``, ...); they win over ``special_tokens`` of the same name, as in
    transformers. An empty tool list is passed as none: several templates test only
    ``tools is not none`` and would announce an empty tool set.
    """
    compiled = _compiled(template)
    variables: dict[str, Any] = {**special_tokens, **template_kwargs}
    variables.update(messages=messages, tools=tools or None, documents=None,
                     add_generation_prompt=add_generation_prompt)
    try:
        return compiled.render(**variables)
    except TemplateError:
        raise
    except _RENDER_ERRORS as exc:
        message = exc.message if isinstance(exc, jinja2.TemplateError) and exc.message else str(exc)
        raise TemplateError(f"the chat template failed to render the conversation: {message}") from exc


def _probe_marker(role: str) -> str:
    return f"steno-role-probe-{role}-7f3c9a"


@functools.lru_cache(maxsize=64)
def _supported_roles(template: str, special_tokens: tuple[tuple[str, str], ...]) -> frozenset[str]:
    tokens = dict(special_tokens)
    supported = set()
    for role in INSTRUCTION_ROLES:
        marker = _probe_marker(role)
        messages = [{"role": role, "content": marker}, {"role": "user", "content": "Hello."}]
        try:
            text = render_chat(template, messages, add_generation_prompt=True, special_tokens=tokens)
        except TemplateError:
            continue
        # A template may drop a role it does not know without a word; only text that
        # reaches the prompt counts.
        if marker in text:
            supported.add(role)
    return frozenset(supported)


def supported_roles(template: str, special_tokens: Mapping[str, str] = _NO_TOKENS) -> frozenset[str]:
    """Which instruction roles (``system``, ``developer``) ``template`` renders: each is
    tried as the first message of a short conversation, and counts when the conversation
    renders and its text is in the prompt. A syntax error in the template surfaces as
    ``TemplateError``."""
    _compiled(template)
    return _supported_roles(template, tuple(sorted(special_tokens.items())))
