"""From a validated request to what gets recorded and published (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from steno.schemas.api import CreateResponseRequest
from steno.schemas.bus import GenerationRequest, ParserSeed, SamplingParams, StructuredOutput
from steno.schemas.events import LoggedEvent, created_event
from steno.schemas.ids import derived_id
from steno.schemas.responses import ReasoningSealing
from steno.services.api.store import NewResponse, StoredResponse
from steno.services.dialects import InvalidInput, RenderedPrompt

LOGPROBS_INCLUDE = "message.output_text.logprobs"
SEALED_REASONING_INCLUDE = "reasoning.encrypted_content"


@dataclass(frozen=True)
class ResponsePlan:
    record: NewResponse
    first_events: list[LoggedEvent]
    generation: GenerationRequest
    # Put on ``generation`` once the first events are stored and their last hash known.
    parser_seed: ParserSeed


def _input_items(request: CreateResponseRequest, response_id: str) -> list[dict[str, Any]]:
    """The input as stored and listed: typed items with ids, message text as content parts."""
    items: list[dict[str, Any]]
    if isinstance(request.input, str):
        items = [{"type": "message", "role": "user", "content": request.input}]
    else:
        items = [dict(item) for item in request.input]
    for position, item in enumerate(items):
        item.setdefault("type", "message")
        item.setdefault("id", derived_id("msg" if item["type"] == "message" else "item", response_id, -1 - position))
        if item["type"] == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
    return items


def _structured_output(request: CreateResponseRequest) -> StructuredOutput | None:
    fmt = request.text.format if request.text else None
    if not fmt or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return StructuredOutput(kind="json_object")
    if fmt["type"] == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise InvalidInput("text.format of type json_schema needs a schema object", "text.format.schema")
        return StructuredOutput(kind="json_schema", json_schema=fmt["schema"])
    raise InvalidInput(f"unsupported text.format type {fmt['type']!r}", "text.format.type")


def base_snapshot(request: CreateResponseRequest, response_id: str, created_at: int, status: str) -> dict[str, Any]:
    """The Response object as created, with every field of the SDK's Response (OpenAI's
    defaults where the request says nothing); every later snapshot starts from it."""
    reasoning = request.reasoning
    text: dict[str, Any] = {"format": request.text.format if request.text and request.text.format else {"type": "text"}}
    if request.text and request.text.verbosity:
        text["verbosity"] = request.text.verbosity
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": request.background,
        "completed_at": None,
        "conversation": {"id": request.conversation_id} if request.conversation_id is not None else None,
        "error": None,
        "incomplete_details": None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": request.max_tool_calls,
        "metadata": request.metadata or {},
        "model": request.model,
        "output": [],
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "prompt": None,
        "prompt_cache_key": request.prompt_cache_key,
        "prompt_cache_retention": request.prompt_cache_retention,
        "reasoning": {
            "effort": reasoning.effort if reasoning else None,
            "summary": reasoning.summary if reasoning else None,
        },
        "safety_identifier": request.safety_identifier,
        "service_tier": request.service_tier if request.service_tier not in (None, "auto") else "default",
        "store": request.store,
        "temperature": request.temperature if request.temperature is not None else 1.0,
        "text": text,
        "tool_choice": request.tool_choice,
        "tools": request.tools,
        "top_logprobs": request.top_logprobs or 0,
        "top_p": request.top_p if request.top_p is not None else 1.0,
        "truncation": request.truncation,
        "usage": None,
        "user": request.user,
        # The SDK's, for what Steno does not do (images, moderation, prompt caches).
        **dict.fromkeys(_UNUSED_RESPONSE_FIELDS),
    }


_UNUSED_RESPONSE_FIELDS = ("access_programs", "image", "input_transformations", "moderation",
                           "prompt_cache_diagnostics", "prompt_cache_options", "tool_usage")


def history_items(chain: list[StoredResponse], inputs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """What earlier turns said, oldest first: each turn's input items, then its output."""
    items: list[dict[str, Any]] = []
    for turn in chain:
        items += inputs.get(turn.response_id, [])
        items += (turn.snapshot or {}).get("output", [])
    return items


def plan_response(
    request: CreateResponseRequest,
    response_id: str,
    tenant_id: str,
    created_at: int,
    prompt: RenderedPrompt,
    reasoning_sealing: ReasoningSealing | None = None,
    truncated_items: int = 0,
) -> ResponsePlan:
    """``prompt``: the request rendered in its model's dialect; ``reasoning_sealing``: how
    its reasoning is sealed, when the request includes ``reasoning.encrypted_content``;
    ``truncated_items``: how many items ``truncation: "auto"`` left out of the prompt.
    Raises InvalidInput for a ``text.format`` Steno cannot apply."""
    include = set(request.include or [])
    wants_logprobs = LOGPROBS_INCLUDE in include or bool(request.top_logprobs)
    parse_context = prompt.parse_context.model_copy(
        update={"include_logprobs": wants_logprobs, "reasoning_sealing": reasoning_sealing})
    status = "queued" if request.background else "in_progress"
    snapshot = base_snapshot(request, response_id, created_at, status)
    if truncated_items:
        # Not a field of OpenAI's Response: how a client learns its prompt was shortened.
        snapshot["truncated_items"] = truncated_items
    sampling = SamplingParams(
        max_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_logprobs=(request.top_logprobs or 0) if wants_logprobs else None,
        seed=request.seed,
        stop_token_ids=prompt.stop_token_ids,
        structured_output=_structured_output(request),
    )
    record = NewResponse(
        response_id=response_id,
        tenant_id=tenant_id,
        model=request.model,
        status=status,
        background=request.background,
        store=request.store,
        previous_response_id=request.previous_response_id,
        request=request.model_dump(mode="json", exclude_none=True),
        parse_context=parse_context.model_dump(),
        base_snapshot=snapshot,
        input_items=_input_items(request, response_id),
    )
    return ResponsePlan(
        record=record,
        first_events=[created_event(snapshot)],
        generation=GenerationRequest(
            response_id=response_id, model=request.model, prompt_token_ids=prompt.token_ids, sampling=sampling,
            groupable=request.store,
        ),
        parser_seed=ParserSeed(base_snapshot=snapshot, parse_context=record.parse_context),
    )
