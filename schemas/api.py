"""The request bodies Steno accepts (responses are the ``openai`` SDK's own types)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


class ReasoningParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    effort: Literal["minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class TextParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_obfuscation: bool | None = None


class CreateResponseRequest(BaseModel):
    """``POST /v1/responses``. Unknown fields are rejected, as OpenAI does."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    stream: bool = False
    background: bool = False
    store: bool = True
    metadata: dict[str, str] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    reasoning: ReasoningParams | None = None
    text: TextParams | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    include: list[str] | None = None
    stream_options: StreamOptions | None = None
    previous_response_id: str | None = None
    service_tier: str | None = None
    seed: int | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return value
        if len(value) > MAX_METADATA_PAIRS:
            raise ValueError(f"at most {MAX_METADATA_PAIRS} key-value pairs")
        for key, item in value.items():
            if len(key) > MAX_METADATA_KEY:
                raise ValueError(f"keys are at most {MAX_METADATA_KEY} characters")
            if len(item) > MAX_METADATA_VALUE:
                raise ValueError(f"values are at most {MAX_METADATA_VALUE} characters")
        return value
