"""The Responses service: what ``/v1/responses`` does, apart from HTTP.

Creating a response records it (row, input items, ``response.created``) in one
statement, then queues its generation; streaming hands it to the edge; retrieving
folds what is stored. A response made in a conversation takes its history from the
conversation and is appended to it before it is queued (``conversations.py``). Every
lookup is scoped to the caller's tenant: another tenant's response is the same 404 as a
missing one."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, get_args

import orjson
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore
from openai.types.responses import ResponseIncludable
from opentelemetry import context as otel_context
from opentelemetry import trace

from steno.schemas.api import CountInputTokensRequest, CreateResponseRequest
from steno.schemas.bus import (
    CancelOrder,
    GenerationEnded,
    GenerationRequest,
    StoredGenerationRequest,
    WorkerRegistration,
)
from steno.schemas.events import LoggedEvent, failure_events
from steno.schemas.fold import fold
from steno.schemas.ids import new_response_id
from steno.schemas.responses import ReasoningSealing
from steno.services.api.conversations import ConversationsService
from steno.services.api.errors import ApiError
from steno.services.api.item_references import resolved_references
from steno.services.api.limits import check_request, is_id
from steno.services.api.models import ModelDirectory
from steno.services.api.quotas import QuotaGate
from steno.services.api.rendering import PromptRenderer, RenderFailed
from steno.services.api.response_plan import SEALED_REASONING_INCLUDE, history_items, plan_response
from steno.services.api.store import InputItemsPage, NewResponse, ResponseStore, StoredResponse
from steno.services.api.truncation import Conversation, TurnSearch, without_oldest_turns
from steno.services.common import logs
from steno.services.common.bus import Names, affinity_shard
from steno.services.common.metrics import CANCEL_LATENCY, CANCELS, StreamTiming, request_arrived
from steno.services.common.model_files import ModelFilesMissing, ensure_model_files
from steno.services.common.reasoning_keys import ReasoningKeys
from steno.services.common.reasoning_seal import SealError, key_id_of
from steno.services.common.stored_publish import StoredPublisher
from steno.services.common.tracing import message_headers, traced_stream, tracer
from steno.services.dialects import Dialect, InvalidInput, RenderedPrompt, UnknownDialect, dialect_for
from steno.services.edge import KEEPALIVE_S, EventReader, LiveEvents, ResponseTail, sse_body

log = logging.getLogger(__name__)

INCLUDABLE = frozenset(get_args(ResponseIncludable))
# How long a cancel waits for the terminal event before answering with the snapshot as it
# stands, and how long of that for a worker to end the response before Steno ends it.
CANCEL_WAIT_S = 10.0
CANCEL_NUDGE_S = 2.0
INTERRUPTED = "The stream was interrupted; resume it with starting_after set to the last sequence number received."
UNPUBLISHED = "The generation queue was unavailable."


@dataclass(frozen=True)
class EventStream:
    """A response's events as SSE chunks, each with whether it ends the stream."""

    chunks: AsyncGenerator[tuple[bytes, bool], None]


def check_include(include: list[str] | None, param: str = "include") -> None:
    for index, value in enumerate(include or []):
        if value not in INCLUDABLE:
            raise ApiError(400, f"Unsupported include value {value!r}.", param=f"{param}[{index}]",
                           code="invalid_value")


def _refuse_unheld_state(request: CreateResponseRequest) -> None:
    """Fields that name state kept on OpenAI's side, which a server without it would
    silently ignore: refused instead; and a history asked for twice."""
    if request.conversation is not None and request.previous_response_id is not None:
        raise ApiError(400, "Mutually exclusive parameters: Ensure you are only providing one of: "
                       "'previous_response_id' or 'conversation'.", param="conversation",
                       code="mutually_exclusive_parameters")
    if request.prompt is not None:
        raise ApiError(400, "Stored prompt templates are not available on this server: send the prompt's "
                       "text as instructions and input.", param="prompt", code="unsupported_parameter")


def _model(registration: WorkerRegistration) -> dict[str, Any]:
    return {"id": registration.model, "object": "model", "created": registration.created, "owned_by": "steno"}


def _check_context(prompt: RenderedPrompt, registration: WorkerRegistration) -> None:
    """A prompt that leaves the model no room to answer is refused before anything is
    recorded, as OpenAI refuses it."""
    if len(prompt.token_ids) >= registration.context_tokens:
        raise ApiError(400, f"Your input exceeds the context window of this model: the prompt is "
                       f"{len(prompt.token_ids)} tokens, and the model holds {registration.context_tokens} tokens "
                       "with its output.", param="input", code="context_length_exceeded")


def _not_found(response_id: str) -> ApiError:
    named = f" with id '{response_id}'" if is_id(response_id) else ""  # nothing else is echoed back
    return ApiError(404, f"No response found{named}.", param="response_id")


class ResponsesService:
    def __init__(
        self,
        *,
        names: Names,
        js: JetStreamContext,
        publisher: StoredPublisher,
        store: ResponseStore,
        reader: EventReader,
        tail: ResponseTail,
        models: ModelDirectory,
        renderer: PromptRenderer,
        cancel_flags: KeyValue,
        request_store: ObjectStore,
        message_limit: int,
        origin: str,
        reasoning_keys: ReasoningKeys,
        conversations: ConversationsService,
        quotas: QuotaGate,
    ) -> None:
        """``origin``: this process's tag, carried by the ids it makes (their events are
        announced where ``tail`` listens for them). ``message_limit``: the largest bus
        message; a larger generation request goes through ``request_store``."""
        self._names = names
        self._js = js
        self._publisher = publisher
        self._renderer = renderer
        self._request_store = request_store
        self._message_limit = message_limit
        self._store = store
        self._reader = reader
        self._tail = tail
        self._models = models
        self._cancel_flags = cancel_flags
        self._origin = origin
        self._reasoning_keys = reasoning_keys
        self._conversations = conversations
        self._quotas = quotas

    async def create(self, request: CreateResponseRequest, tenant: str) -> EventStream | dict[str, Any]:
        """Records and queues a response: its event stream (``stream``), the queued
        response (``background``), or the finished one."""
        with (tracer.start_as_current_span("responses.create", attributes={
                "steno.model": request.model, "steno.tenant": tenant, "steno.stream": bool(request.stream)}),
              logs.response_context(tenant=tenant, model=request.model)):
            return await self._create(request, tenant)

    async def _create(self, request: CreateResponseRequest, tenant: str) -> EventStream | dict[str, Any]:
        check_request(request)
        _refuse_unheld_state(request)
        if request.background and not request.store:
            raise ApiError(400, "Background responses must be stored (store=true).", param="store",
                           code="invalid_value")
        if request.conversation is not None and not request.store:
            # A turn appended to a conversation is kept with it, which store=false rules out.
            raise ApiError(400, "A response in a conversation is appended to it and must be stored (store=true); "
                           "without storing, carry the history in input.", param="store", code="invalid_value")
        check_include(request.include)
        request = await self._resolved_references(request, tenant)
        history = await self._history(request, tenant, for_new_turn=True)
        registration, dialect = await self._served(request.model)
        created_at = int(time.time())
        prompt, left_out = await self._render_to_fit(dialect, request, created_at, history, tenant, registration)
        response_id = new_response_id(self._origin)
        logs.bind(response_id=response_id, attempt=0)
        trace.get_current_span().set_attribute("steno.response_id", response_id)
        sealing = None
        if SEALED_REASONING_INCLUDE in (request.include or []):
            sealing = ReasoningSealing(key_id=(await self._reasoning_keys.current()).current, tenant=tenant)
        try:
            plan = plan_response(request, response_id, tenant, created_at, prompt, sealing, left_out)
        except InvalidInput as exc:
            raise ApiError(400, str(exc), param=exc.param, code="invalid_value") from exc
        snapshot = plan.record.base_snapshot
        # Last before anything is stored: a refused request leaves nothing behind.
        await self._quotas.admit(tenant, response_id, len(prompt.token_ids))
        plan.generation.seed_parser(plan.parser_seed, await self._store.create(plan.record, plan.first_events))
        if request.conversation_id is not None:
            await self._append_to_conversation(request.conversation_id, tenant, plan.record)
        # A stream listens before the work is queued, so it starts from the events just
        # stored without reading them back.
        live = await self._tail.listen(response_id) if request.stream else None
        try:
            await self._queue(plan.generation, self._work_subject(request, tenant))
        except Exception as exc:
            log.exception("publishing %s failed", response_id)
            if live is not None:
                await live.close()
            events, failed = failure_events(len(plan.first_events), snapshot, UNPUBLISHED,
                                            completed_at=int(time.time()))
            await self._store.fail_unstarted(response_id, events, failed)
            raise ApiError(503, "The generation queue is unavailable; retry shortly.") from exc
        log.info("response accepted", extra={"stream": bool(request.stream), "background": bool(request.background)})
        logs.debug_content(log, "response input", instructions=request.instructions, input=request.input)
        if live is not None:
            return self._event_stream(response_id, -1, snapshot, live=live, known=plan.first_events,
                                      timing=StreamTiming(request.model, request_arrived()))
        if request.background:
            return snapshot
        final = await self._terminal_snapshot(response_id)
        if final is None:
            raise ApiError(500, "The response ended without a terminal event.")
        return final

    async def count_input_tokens(self, body: CountInputTokensRequest, tenant: str) -> dict[str, Any]:
        """The tokens the request's prompt takes, rendered as a response would render it."""
        request = body.as_request()
        check_request(request)
        _refuse_unheld_state(request)
        request = await self._resolved_references(request, tenant)
        history = await self._history(request, tenant, for_new_turn=False)
        registration, dialect = await self._served(request.model)
        if request.truncation == "auto":
            prompt, _ = await self._render_to_fit(dialect, request, int(time.time()), history, tenant, registration)
        else:  # counted, however long
            prompt = await self._render(dialect, request, int(time.time()), history, tenant)
        return {"object": "response.input_tokens", "input_tokens": len(prompt.token_ids)}

    async def _render_to_fit(
        self, dialect: Dialect, request: CreateResponseRequest, created_at: int, history: list[dict[str, Any]],
        tenant: str, registration: WorkerRegistration,
    ) -> tuple[RenderedPrompt, int]:
        """The prompt, checked against the model's context, and how many items it leaves
        out. With ``truncation: "auto"``, a prompt that does not fit leaves out the fewest
        oldest turns that make it fit (``services/api/truncation.py``); the request is
        recorded as sent."""
        prompt = await self._render(dialect, request, created_at, history, tenant)
        fits = len(prompt.token_ids) < registration.context_tokens
        if fits or request.truncation != "auto":
            _check_context(prompt, registration)
            return prompt, 0
        whole = Conversation(history, list(request.input) if isinstance(request.input, list) else [
            {"type": "message", "role": "user", "content": request.input}])
        best: tuple[RenderedPrompt, int] | None = None
        # Each render mostly reuses the messages rendered before.
        search = TurnSearch(whole)
        while (turns := search.next_try()) is not None:
            kept, left_out = without_oldest_turns(whole, turns)
            shorter = request.model_copy(update={"input": kept.input})
            candidate = await self._render(dialect, shorter, created_at, kept.history, tenant)
            fits = len(candidate.token_ids) < registration.context_tokens
            search.tried(turns, fits)
            if fits:
                best = (candidate, left_out)
        if best is None:
            _check_context(prompt, registration)  # even the last turn alone does not fit
        assert best is not None
        return best

    async def _render(self, dialect: Dialect, request: CreateResponseRequest, created_at: int,
                      history: list[dict[str, Any]], tenant: str) -> RenderedPrompt:
        """The prompt, with the reasoning that input items carry sealed opened first."""
        opened = await self._opened_reasoning(request, tenant)
        try:
            return await self._renderer.render(dialect, opened, created_at, history, reuse_scope=tenant)
        except RenderFailed as exc:
            raise ApiError(400, str(exc), param=exc.param or "input", code="invalid_value") from exc

    async def _resolved_references(self, request: CreateResponseRequest, tenant: str) -> CreateResponseRequest:
        """``request`` with each ``item_reference`` input item replaced by the stored item
        it names (as it is then recorded, so that later turns need no lookup)."""
        if not isinstance(request.input, list):
            return request
        items = await resolved_references(request.input, self._store, tenant, "input")
        return request if items is request.input else request.model_copy(update={"input": items})

    async def _opened_reasoning(self, request: CreateResponseRequest, tenant: str) -> CreateResponseRequest:
        """``request`` with each reasoning input item that carries ``encrypted_content``
        holding its text (the items as sent are what is recorded); a blob that does not
        open is a 400."""
        if not isinstance(request.input, list) or not any(
                isinstance(item, dict) and item.get("type") == "reasoning" and item.get("encrypted_content")
                for item in request.input):
            return request
        items = list(request.input)
        for index, item in enumerate(items):
            blob = item.get("encrypted_content") if isinstance(item, dict) and item.get("type") == "reasoning" \
                else None
            if not blob:
                continue
            param = f"input[{index}].encrypted_content"
            if not isinstance(blob, str):
                raise ApiError(400, "encrypted_content must be a string.", param=param, code="invalid_value")
            try:
                seal = await self._reasoning_keys.holding(key_id_of(blob))
                text = seal.open(blob, tenant=tenant)
            except SealError as exc:
                raise ApiError(400, f"The reasoning item's {exc}.", param=param,
                               code="invalid_encrypted_content") from exc
            items[index] = {**item, "content": [{"type": "reasoning_text", "text": text}]}
        return request.model_copy(update={"input": items})

    def models(self) -> dict[str, Any]:
        """The models live workers serve, as OpenAI lists models."""
        return {"object": "list", "data": [_model(registration) for registration in self._models.served()]}

    async def model(self, model: str) -> dict[str, Any]:
        registration = await self._models.registration(model)
        if registration is None:
            raise ApiError(404, f"The model '{model}' does not exist or no worker serves it.", param="model",
                           code="model_not_found")
        return _model(registration)

    async def retrieve(self, response_id: str, tenant: str) -> dict[str, Any]:
        return await self._current_snapshot(await self._owned(response_id, tenant))

    async def stream(self, response_id: str, tenant: str, starting_after: int | None) -> EventStream:
        """Every stored event after ``starting_after`` (all without it), then the live ones."""
        stored = await self._owned(response_id, tenant)
        if starting_after is not None:
            if starting_after < 0:
                raise ApiError(400, "starting_after must be a sequence number (0 or more).", param="starting_after")
            # A running response's stream waits for events to come; a finished one has none to come.
            last = await self._store.last_seq(response_id)
            if stored.finished and starting_after >= last:
                raise ApiError(400, f"starting_after={starting_after} is beyond the end of the stream "
                               f"(last event {last}).", param="starting_after")
        after = -1 if starting_after is None else starting_after
        return self._event_stream(response_id, after, stored.base_snapshot)

    async def cancel(self, response_id: str, tenant: str) -> dict[str, Any]:
        """Cancels a background response: its terminal snapshot, or (if the terminal event
        is slow to come) the snapshot as it stands."""
        stored = await self._owned(response_id, tenant)
        if not stored.background:
            raise ApiError(400, "Only responses created with background=true can be cancelled.", param="response_id")
        if stored.status == "cancelled":
            return await self._current_snapshot(stored)
        if stored.finished:
            raise ApiError(400, f"Cannot cancel a response whose status is '{stored.status}'.", param="response_id")
        CANCELS.inc()
        with CANCEL_LATENCY.time():
            return await self._cancelled(response_id, tenant, stored)

    async def _cancelled(self, response_id: str, tenant: str, stored: StoredResponse) -> dict[str, Any]:
        """Orders the cancel and waits for its end, as ``cancel`` says."""
        await self._order_cancel(response_id)
        final = await self._terminal_snapshot(response_id, CANCEL_NUDGE_S)
        if final is None:
            # No worker ended it (none serves the model any more, or its worker is gone):
            # the response is ended where its token stream stands, by the parser as ever.
            await self._end_cancelled(response_id)
            final = await self._terminal_snapshot(response_id, CANCEL_WAIT_S - CANCEL_NUDGE_S)
        if final is not None:
            return final
        refreshed = await self._store.get(response_id, tenant)
        return await self._current_snapshot(refreshed or stored)

    async def delete(self, response_id: str, tenant: str) -> dict[str, Any]:
        """Deletes a response with its events, tokens and input items; a running one is
        cancelled first."""
        stored = await self._owned(response_id, tenant)
        if not stored.finished:
            await self._order_cancel(response_id)
        if not await self._store.delete(response_id, tenant):
            raise _not_found(response_id)  # deleted meanwhile
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def input_items(self, response_id: str, tenant: str, after: str | None, limit: int,
                          descending: bool) -> InputItemsPage:
        await self._owned(response_id, tenant)
        page = None
        if after is None or is_id(after):
            page = await self._store.input_items_page(response_id, after, limit, descending=descending)
        if page is None:
            named = f" with id '{after}'" if after is not None and is_id(after) else ""
            raise ApiError(400, f"No input item{named} in this response.", param="after")
        return page

    async def _owned(self, response_id: str, tenant: str) -> StoredResponse:
        """The caller's stored response, or the same 404 whether it is missing or another tenant's."""
        if not is_id(response_id):
            raise _not_found(response_id)
        stored = await self._store.get(response_id, tenant)
        if stored is None:
            raise _not_found(response_id)
        return stored

    def _work_subject(self, request: CreateResponseRequest, tenant: str) -> str:
        """The model's shared queue, or for a request with a ``prompt_cache_key`` the
        affinity shard of the tenant's key, which one worker of the model pulls."""
        if not request.prompt_cache_key:
            return self._names.gen_subject(request.model)
        shard = affinity_shard(tenant, request.prompt_cache_key, self._names.affinity_shards)
        return self._names.gen_affinity_subject(request.model, shard)

    async def _queue(self, generation: GenerationRequest, subject: str) -> None:
        """Publishes the work; one too large for a bus message goes into the request
        store, and a note of where it is goes on the queue."""
        body = generation.model_dump_json().encode()
        if len(body) > self._message_limit:
            await self._request_store.put(generation.response_id, body)
            body = StoredGenerationRequest(response_id=generation.response_id, model=generation.model,
                                           name=generation.response_id).model_dump_json().encode()
        await self._publisher.publish(subject, body, message_headers(generation.response_id))

    async def _served(self, model: str) -> tuple[WorkerRegistration, Dialect]:
        """The model's registration and dialect: a 404 when no worker serves it."""
        registration = await self._models.registration(model)
        if registration is None:
            raise ApiError(404, f"The model '{model}' does not exist or no worker serves it.", param="model",
                           code="model_not_found")
        try:
            if registration.dialect_files is not None:
                await ensure_model_files(self._js, self._names, registration.dialect_files)
            return registration, dialect_for(registration.dialect, registration.dialect_files)
        except (UnknownDialect, ModelFilesMissing) as exc:
            log.error("model %s is served in dialect %r, which this API does not know", model, registration.dialect)
            raise ApiError(503, f"The model '{model}' speaks a dialect this server cannot render yet; retry "
                           "shortly.", param="model") from exc

    async def _history(self, request: CreateResponseRequest, tenant: str, *,
                       for_new_turn: bool) -> list[dict[str, Any]]:
        """What earlier turns said: the conversation's items, or the previous responses'
        input and output items."""
        if request.conversation_id is not None:
            return await self._conversations.history(request.conversation_id, tenant, for_new_turn=for_new_turn)
        if request.previous_response_id is None:
            return []
        chain = await self._store.conversation_before(request.previous_response_id, tenant)
        if not chain or chain[-1].response_id != request.previous_response_id:
            raise ApiError(400, f"Previous response with id '{request.previous_response_id}' not found.",
                           param="previous_response_id", code="previous_response_not_found")
        if not chain[-1].finished:
            raise ApiError(400, f"Previous response '{request.previous_response_id}' has not finished yet.",
                           param="previous_response_id", code="previous_response_in_progress")
        inputs = await self._store.input_items_of([turn.response_id for turn in chain])
        return history_items(chain, inputs)

    async def _append_to_conversation(self, conversation_id: str, tenant: str, record: NewResponse) -> None:
        """Makes the response just stored (not yet queued) the conversation's next turn;
        one the conversation refuses (another turn running, deleted meanwhile) is
        deleted again, unseen."""
        try:
            await self._conversations.append_response(conversation_id, tenant, record.response_id,
                                                      record.input_items)
        except ApiError:
            await self._store.delete(record.response_id, tenant)
            raise

    def _event_stream(self, response_id: str, after: int, snapshot: dict[str, Any], live: LiveEvents | None = None,
                      known: list[LoggedEvent] | None = None, timing: StreamTiming | None = None) -> EventStream:
        runs = self._tail.runs(response_id, after=after, live=live, known=known, keepalive_s=KEEPALIVE_S)

        def interrupted(last_seq: int) -> list[LoggedEvent]:
            """The end of a stream the edge could not finish (not part of the log)."""
            return failure_events(last_seq + 1, snapshot, INTERRUPTED, event_code="stream_interrupted")[0]

        # Within the request's trace when streamed as it is created; a resumed stream starts its own.
        return EventStream(traced_stream(sse_body(runs, interrupted, timing), "responses.stream",
                                         otel_context.get_current(), {"steno.response_id": response_id}))

    async def _terminal_snapshot(self, response_id: str, timeout_s: float | None = None) -> dict[str, Any] | None:
        async def wait() -> dict[str, Any] | None:
            async for event in self._tail.events(response_id, after=-1):
                if event.is_terminal:
                    terminal: dict[str, Any] = orjson.loads(event.payload)["response"]
                    return terminal
            return None

        try:
            return await asyncio.wait_for(wait(), timeout_s)
        except TimeoutError:
            return None

    async def _current_snapshot(self, stored: StoredResponse) -> dict[str, Any]:
        if stored.snapshot is not None:
            return stored.snapshot
        events = await self._reader.read_after(stored.response_id, -1)
        return fold(orjson.loads(e.payload) for e in events) or stored.base_snapshot

    async def _end_cancelled(self, response_id: str) -> None:
        """Puts a cancelled end on the response's token stream at its next position. Had a
        worker published there meanwhile, the end counts as a duplicate and that worker,
        seeing the cancel order, ends the response itself."""
        at = await self._store.stream_position(response_id)
        ended = GenerationEnded(response_id=response_id, attempt=at.attempt, batch_count=at.next_batch_no,
                                finish_reason="cancelled", prompt_tokens=at.prompt_tokens,
                                output_tokens=at.output_tokens, completed_at=int(time.time()))
        await self._publisher.publish(self._names.tokens_subject(response_id), ended.model_dump_json().encode(),
                                      {"Nats-Msg-Id": f"{response_id}:cancelled:{at.attempt}:{at.next_batch_no}"})

    async def _order_cancel(self, response_id: str) -> None:
        await self._store.request_cancel(response_id)
        # Every worker watches the flags: the one generating the response aborts it, and
        # whichever picks it up later ends it at once.
        await self._cancel_flags.put(response_id, CancelOrder(response_id=response_id).model_dump_json().encode())
