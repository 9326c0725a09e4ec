"""The dialect interface: what Steno knows of a model's format, in one place.

A dialect turns a Responses request into the prompt's token ids (with what the parser
must know of the request and the tokens that end a turn), splits completion tokens into
message fragments, and tells the simulator and constrained decoding how the model
speaks. The API, the workers and the parser pick a dialect per model and otherwise know
nothing of the format; the bus, the event log and the edge carry token ids and events.

Fragments speak one vocabulary whatever the dialect:

- ``channel``: ``analysis`` is reasoning, ``final`` the answer, ``commentary`` a
  preamble or a tool call; any other channel is text for the user.
- ``recipient``: None for text; ``functions.<name>`` a function or custom tool (a
  namespaced one as ``functions.<namespace>.<name>``); ``browser.<search|open|find>``
  web search, with the arguments of gpt-oss's browser tool (``{"query"}``, ``{"id",
  "cursor"}``, ``{"pattern", "cursor"}``); ``python`` the code interpreter; ``mcp.<name>``
  (or anything else, such as ``container.exec``) an MCP tool.
- ``content_type``: what the header declared (``json`` for JSON arguments), if anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from steno.schemas.api import CreateResponseRequest
from steno.schemas.responses import ParseContext


class InvalidInput(ValueError):
    """The request cannot be rendered; ``param`` names the offending field (a 400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class RenderedPrompt:
    token_ids: list[int]
    parse_context: ParseContext
    # Tokens that end the model's turn (the engine stops at them).
    stop_token_ids: list[int]


@dataclass(frozen=True, slots=True)
class MessageStarted:
    channel: str | None
    recipient: str | None
    content_type: str | None


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    # The tokens that produced this text, within the tokens fed in one call: from
    # token_index, token_count of them.
    token_index: int
    token_count: int = 1


@dataclass(frozen=True, slots=True)
class MessageEnded:
    pass


@dataclass(frozen=True, slots=True)
class MalformedOutput:
    """The model broke its format; the tokens after this one are not parsed."""

    detail: str


Fragment = MessageStarted | TextDelta | MessageEnded | MalformedOutput


class CompletionSplitter(Protocol):
    """Incremental: one per response, fed its completion tokens in order."""

    # Reasoning tokens so far (reported as usage.output_tokens_details.reasoning_tokens).
    reasoning_tokens: int

    def feed(self, token_ids: Sequence[int]) -> list[Fragment]: ...

    def finish(self) -> list[Fragment]:
        """The output ended (without a stop token, say at max_tokens): what was held back
        to decide what it is."""
        ...


@dataclass(frozen=True)
class Grammar:
    """The grammar a custom tool's input must match."""

    syntax: str  # "lark" or "regex"
    definition: str


@dataclass(frozen=True)
class OfferedTool:
    """A tool as a prompt offers it."""

    # A JSON schema of its arguments, as far as the prompt tells them.
    parameters: dict[str, Any]
    # A custom tool's grammar, for its single string argument.
    grammar: Grammar | None = None


@dataclass(frozen=True)
class PromptFacts:
    """What the simulator reads off a rendered prompt."""

    user_text: str
    # Qualified function name -> the tool.
    functions: dict[str, OfferedTool] = field(default_factory=dict)
    # The text of the tool result the prompt ends with, if it ends with one.
    tool_result: str | None = None
    # Whether the prompt leaves the model to reason (a template can close the reasoning
    # block itself, as Qwen3's does with thinking turned off).
    reasoning: bool = True


@dataclass(frozen=True)
class CompletionMessage:
    """One message of a completion the simulator writes, in the fragment vocabulary."""

    channel: str
    text: str
    recipient: str | None = None
    content_type: str | None = None


# Where a constrained answer's grammar applies: after free reasoning, to the final
# answer only ("final"), or to the whole completion ("whole").
StructuredOutputScope = Literal["final", "whole"]


class Dialect(Protocol):
    name: str

    @property
    def files(self) -> str | None:
        """The digest of the model's files (ChatTemplateFiles) the dialect is built from;
        None for one that needs none."""
        ...

    def render(
        self, request: CreateResponseRequest, created_at: int, history: Sequence[dict[str, Any]] = (),
        reuse_scope: str = "",
    ) -> RenderedPrompt:
        """The prompt for ``request`` after ``history`` (earlier turns' items, oldest
        first); raises InvalidInput for what it cannot render. What a dialect keeps of a
        request to reuse for the next (rendered text) serves only requests of the same
        ``reuse_scope`` (the tenant)."""
        ...

    def splitter(self, context: ParseContext) -> CompletionSplitter: ...

    def token_text(self, token_id: int) -> str:
        """One token's text, as reported in logprobs."""
        ...

    def read_prompt(self, prompt_token_ids: Sequence[int]) -> PromptFacts: ...

    def write_completion(self, messages: Sequence[CompletionMessage]) -> list[int]:
        """The completion tokens of ``messages``, ending the turn as the last one asks
        (a tool call hands the turn to the tool)."""
        ...

    def answer_grammar(
        self, json_schema: dict[str, Any], scope: StructuredOutputScope, max_whitespace: int | None
    ) -> dict[str, Any]:
        """An xgrammar structural tag (as vLLM takes it) for a completion whose answer is
        JSON matching ``json_schema``."""
        ...
