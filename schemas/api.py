"""The request bodies Steno accepts (responses are the ``openai`` SDK's own types).

``CreateResponseRequest`` declares every field of the SDK's ``ResponseCreateParams``
(a test holds the two together), plus ``stream`` and ``client_metadata``, which clients
send; anything else is refused, as OpenAI refuses it. Fields Steno has no use for are
accepted, kept with the request and, where the Response has them, echoed."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
# The metadata key that sets how long a stored response (or conversation) is kept
# (migration 0010: it wins over the tenant's and the default retention policy).
RETENTION_METADATA_KEY = "steno_retention_days"
MAX_RETENTION_DAYS = 36_500
MAX_METADATA_VALUE = 512
MAX_INT64 = 2**63 - 1

ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class _Body(BaseModel):
    """A part of a request: unknown fields are refused, and an explicit null is the
    field's default (the SDK sends nulls for what it leaves unset)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and None in data.values():
            fields = cls.model_fields
            return {key: value for key, value in data.items()
                    if value is not None or key not in fields or fields[key].default is None}
        return data


class ReasoningParams(_Body):
    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None
    # How much of earlier turns' reasoning the model sees, and the execution mode:
    # accepted; the dialect decides what a model is shown.
    context: str | None = None
    mode: str | None = None


class TextParams(_Body):
    format: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class StreamOptions(_Body):
    include_obfuscation: bool | None = None


class ConversationReference(_Body):
    """A request's ``conversation`` given as an object."""

    id: str


class CreateResponseRequest(_Body):
    """``POST /v1/responses``."""

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    stream: bool = False
    background: bool = False
    store: bool = True
    metadata: dict[str, str] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_INT64)
    max_tool_calls: int | None = Field(default=None, ge=0, le=MAX_INT64)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    reasoning: ReasoningParams | None = None
    text: TextParams | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    truncation: Literal["auto", "disabled"] = "disabled"
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    include: list[str] | None = None
    stream_options: StreamOptions | None = None
    previous_response_id: str | None = None
    service_tier: str | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=MAX_INT64)
    # Sent by clients (Codex) to every provider; kept with the request.
    client_metadata: dict[str, Any] | None = None
    # The conversation whose items are the response's history, and which its input and
    # output are appended to (``services/api/conversations.py``).
    conversation: str | ConversationReference | None = None
    # The SDK's, with no meaning here: accepted and kept with the request. ``prompt`` (a
    # stored prompt template) names state Steno does not hold; it is refused when set
    # (see ``responses.py``).
    prompt: dict[str, Any] | None = None
    access_programs: Any = None
    background_options: Any = None
    context_management: Any = None
    image: Any = None
    moderation: Any = None
    prompt_cache_options: Any = None

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return checked_metadata(value)

    @property
    def conversation_id(self) -> str | None:
        """The conversation named, whichever way it was."""
        return self.conversation.id if isinstance(self.conversation, ConversationReference) else self.conversation


def checked_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    """Metadata within OpenAI's limits (and a retention Steno can apply), for responses
    and conversations alike."""
    if value is None:
        return value
    if len(value) > MAX_METADATA_PAIRS:
        raise ValueError(f"at most {MAX_METADATA_PAIRS} key-value pairs")
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY:
            raise ValueError(f"keys are at most {MAX_METADATA_KEY} characters")
        if len(item) > MAX_METADATA_VALUE:
            raise ValueError(f"values are at most {MAX_METADATA_VALUE} characters")
    retention = value.get(RETENTION_METADATA_KEY)
    if retention is not None and not (retention.isascii() and retention.isdigit()
                                      and 0 < int(retention) <= MAX_RETENTION_DAYS):
        raise ValueError(f"{RETENTION_METADATA_KEY} is a whole number of days, 1 to {MAX_RETENTION_DAYS}")
    return value


class CountInputTokensRequest(_Body):
    """``POST /v1/responses/input_tokens``: the fields of a request that make its prompt."""

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: ReasoningParams | None = None
    text: TextParams | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    conversation: str | ConversationReference | None = None
    personality: str | None = None

    def as_request(self) -> CreateResponseRequest:
        """The request whose prompt this counts."""
        return CreateResponseRequest.model_validate(self.model_dump(exclude={"personality"}))


# At most this many items are added to a conversation by one request, as OpenAI allows.
MAX_CONVERSATION_ITEMS = 20


class CreateConversationRequest(_Body):
    """``POST /v1/conversations``: the SDK's ``ConversationCreateParams``."""

    items: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_CONVERSATION_ITEMS)
    metadata: dict[str, str] | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return checked_metadata(value)


class UpdateConversationRequest(BaseModel):
    """``POST /v1/conversations/{id}``: the SDK's ``ConversationUpdateParams``, whose
    metadata replaces the conversation's. Required, and null clears it (so not a
    ``_Body``, where null means the default)."""

    model_config = ConfigDict(extra="forbid")

    metadata: dict[str, str] | None

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return checked_metadata(value)


class CreateConversationItemsRequest(_Body):
    """``POST /v1/conversations/{id}/items``: the SDK's ``ItemCreateParams`` body
    (``include`` comes in the query)."""

    items: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_CONVERSATION_ITEMS)
