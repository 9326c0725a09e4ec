"""Builds real gpt-oss completions with openai-harmony, for tests."""

from __future__ import annotations

from openai_harmony import HarmonyEncoding, Message, Role

from steno.services.dialects import dialect_named
from steno.services.dialects.harmony import HarmonyDialect


def harmony() -> HarmonyDialect:
    dialect = dialect_named("harmony")
    assert isinstance(dialect, HarmonyDialect)
    return dialect


def encoding() -> HarmonyEncoding:
    return harmony().encoding


def completion(messages: list[Message], *, end: str = "<|return|>") -> list[int]:
    """Tokens a model would emit after the prompt's ``<|start|>assistant``."""
    enc = encoding()
    tokens: list[int] = []
    for message in messages:
        tokens += enc.render(message)
    prefix = enc.encode("<|start|>assistant", allowed_special="all")
    assert tokens[: len(prefix)] == prefix
    tokens = tokens[len(prefix):]
    if end:
        tokens[-1] = enc.encode(end, allowed_special="all")[0]
    return tokens


def assistant(channel: str, text: str, recipient: str | None = None, content_type: str | None = None) -> Message:
    message = Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)
    if recipient:
        message = message.with_recipient(recipient)
    if content_type:
        message = message.with_content_type(content_type)
    return message
