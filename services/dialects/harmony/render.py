"""Renders a Responses request into the Harmony prompt for gpt-oss (pure).

System message: reasoning effort and conversation start date (no built-in tools: this
server does not run them). Developer message: ``instructions`` (plus any
``system``/``developer`` role input, plus what ``tool_choice`` asks), the function
tools (see ``services/dialects/tools.py``), those that input items add included, and
the ``text.format`` asked for (a "Response Formats" section). Then the input items, in
order."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    ReasoningEffort,
    RenderOptions,
    Role,
    SystemContent,
    TextContent,
    ToolDescription,
)

from steno.schemas.api import CreateResponseRequest
from steno.services.dialects.base import InvalidInput
from steno.services.dialects.conversation import (
    AssistantText,
    Reasoning,
    ToolCall,
    ToolResult,
    Turn,
    UserText,
    read_conversation,
    response_format_section,
)
from steno.services.dialects.reused_tokens import ReusedTokens
from steno.services.dialects.tools import ToolCatalog

# gpt-oss knows three efforts; every value the API allows maps onto one of them.
EFFORTS = {
    "none": ReasoningEffort.LOW,
    "minimal": ReasoningEffort.LOW,
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
    "xhigh": ReasoningEffort.HIGH,
    "max": ReasoningEffort.HIGH,
}


def _call(recipient: str, arguments: str, channel: str = "commentary", content_type: str = "json") -> Message:
    return (
        Message.from_role_and_content(Role.ASSISTANT, arguments)
        .with_channel(channel)
        .with_recipient(recipient)
        .with_content_type(content_type)
    )


def _tool_result(author: str, text: str) -> Message:
    return (
        Message.from_author_and_content(Author.new(Role.TOOL, author), text)
        .with_channel("commentary")
        .with_recipient("assistant")
    )


def _message(turn: Turn) -> Message:
    if isinstance(turn, UserText):
        return Message.from_role_and_content(Role.USER, turn.text)
    if isinstance(turn, AssistantText):
        return Message.from_role_and_content(Role.ASSISTANT, turn.text).with_channel(
            "commentary" if turn.commentary else "final")
    if isinstance(turn, Reasoning):
        return Message.from_role_and_content(Role.ASSISTANT, turn.text).with_channel("analysis")
    if isinstance(turn, ToolCall):
        return _call(turn.recipient, turn.arguments, turn.channel, turn.content_type)
    if isinstance(turn, ToolResult):
        return _tool_result(turn.recipient, turn.text)
    raise InvalidInput(f"unsupported input item type {turn.kind!r}", f"{turn.param}.type")


def build_conversation(
    request: CreateResponseRequest, created_at: int, history: Sequence[dict[str, Any]] = ()
) -> tuple[Conversation, ToolCatalog]:
    """``history``: the items of earlier turns (previous_response_id), oldest first."""
    read = read_conversation(request, history)
    offered = read.offered
    system = SystemContent.new().with_conversation_start_date(
        dt.datetime.fromtimestamp(created_at, dt.UTC).strftime("%Y-%m-%d")
    )
    effort = request.reasoning.effort if request.reasoning else None
    system = system.with_reasoning_effort(EFFORTS[effort or "medium"])
    instructions = read.instructions
    messages = [_message(turn) for turn in read.turns]
    conversation = [Message.from_role_and_content(Role.SYSTEM, system)]
    response_format = response_format_section(request)
    if instructions or offered.functions or response_format:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions("\n\n".join(instructions))
        if offered.functions:
            developer = developer.with_function_tools([
                ToolDescription.new(tool.qualified_name, tool.description, _one_line_descriptions(tool.parameters))
                for tool in offered.functions.values()
            ])
        message = Message.from_role_and_content(Role.DEVELOPER, developer)
        if response_format:
            separator = "\n\n" if instructions or offered.functions else ""
            message = message.adding_content(TextContent(text=separator + response_format))
        conversation.append(message)
    return Conversation.from_messages(conversation + messages), offered


def _one_line_descriptions(schema: Any) -> Any:
    """``schema`` with its parameters' descriptions on one line each: Harmony writes a
    parameter's description as a one-line comment, and a line break would end it."""
    if isinstance(schema, list):
        return [_one_line_descriptions(value) for value in schema]
    if not isinstance(schema, dict):
        return schema
    return {key: " ".join(value.split()) if key == "description" and isinstance(value, str)
            else _one_line_descriptions(value) for key, value in schema.items()}


# Rendered messages are reused: the system and developer messages are the same for most
# requests, a client that keeps its own history sends every earlier turn again, and
# Harmony pays a pass over its special tokens for every formatting token it renders
# (docs/performance.md). A message other than the system message (which holds no
# tenant's text) is reused only for the same tenant (``ReusedTokens``, which also bounds
# what is kept).
class ConversationRenderer:
    """``encoding.render_conversation_for_completion(conversation, Role.ASSISTANT)``,
    message by message as Harmony does it, with messages rendered before reused."""

    def __init__(self, encoding: HarmonyEncoding) -> None:
        self._encoding = encoding
        self._completion_start = encoding.encode("<|start|>assistant", allowed_special="all")
        # keyed by (scope, message JSON, whether the conversation has function tools)
        self.reused = ReusedTokens()

    def render(self, conversation: Conversation, reuse_scope: str = "") -> list[int]:
        messages = conversation.messages
        has_function_tools = any(
            isinstance(content, DeveloperContent) and content.tools and content.tools.get("functions")
            and content.tools["functions"].tools
            for message in messages for content in message.content
        )
        # Harmony's auto_drop_analysis: once the last assistant message is final, analysis
        # messages before the first final one are left out.
        last_assistant_is_final = next(
            (message.channel == "final" for message in reversed(messages) if message.author.role == Role.ASSISTANT),
            False,
        )
        first_final = next((i for i, message in enumerate(messages) if message.channel == "final"), None)
        tokens: list[int] = []
        for index, message in enumerate(messages):
            if last_assistant_is_final and first_final is not None and index < first_final \
                    and message.channel == "analysis":
                continue
            tokens += self._message(message, bool(has_function_tools), reuse_scope)
        return tokens + self._completion_start

    def _message(self, message: Message, has_function_tools: bool, reuse_scope: str) -> Sequence[int]:
        options = RenderOptions(conversation_has_function_tools=has_function_tools)
        key = ("" if message.author.role == Role.SYSTEM else reuse_scope, message.to_json(), has_function_tools)
        return self.reused.tokens(key, lambda: self._encoding.render(message, options))
