"""Messages carried on NATS. Every message names its schema version in ``v`` so a
consumer can refuse (visibly) what it does not understand instead of misreading it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

FinishReason = Literal["stop", "length", "cancelled", "error"]


class StructuredOutput(BaseModel):
    """A `text.format` constraint handed to the engine."""

    kind: Literal["json_schema", "json_object"]
    json_schema: dict | None = None


class SamplingParams(BaseModel):
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    seed: int | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    structured_output: StructuredOutput | None = None


class ParserSeed(BaseModel):
    """What the parser builds a new response's state from, exactly as the API recorded it
    in Postgres. It rides on the generation request and the first token batch, so the
    parser need not read it back before the first content can go out; the worker only
    passes it on."""

    base_snapshot: dict[str, Any]
    parse_context: dict[str, Any]
    # The hash of the last event the API stored (hex; ``schemas/chain.py``), which the
    # parser's first event chains to. None from an API that predates the chain: the
    # parser then reads it from Postgres.
    chain_head: str | None = None


class GenerationRequest(BaseModel):
    """Work for a generation worker: published once per response on ``<ns>.gen.<model>``."""

    kind: Literal["request"] = "request"
    v: Literal[1] = 1
    response_id: str
    model: str
    attempt: int = 0
    prompt_token_ids: list[int]
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    # The parser's seed (a ``ParserSeed``) as its JSON: the worker passes it on to the first
    # batch as it came, neither reading nor writing it again (docs/performance.md, "The
    # parser's seed passed on as it came"). None from an API that sends no seed: the parser
    # then reads it from Postgres.
    parser_seed_json: str | None = Field(default=None, description="a ParserSeed as JSON")
    # Whether its token batches may share messages with other responses'
    # (``TokenBatchGroup``): only a stored response's may, since a response that is not
    # stored has its output purged from the bus once it ends.
    groupable: bool = False

    def seed_parser(self, seed: ParserSeed, head: bytes) -> None:
        """Hands the parser its seed, chained to the hash of the API's last stored event."""
        seed.chain_head = head.hex()
        self.parser_seed_json = seed.model_dump_json(exclude_none=True)


class StoredGenerationRequest(BaseModel):
    """Work whose GenerationRequest is larger than a bus message may be (a long prompt,
    large tools): the request itself is in the request store, a JetStream object store,
    under ``name``, and this is what goes on ``<ns>.gen.<model>`` in its place."""

    kind: Literal["stored"] = "stored"
    v: Literal[1] = 1
    response_id: str
    model: str
    name: str


class QueueCheck(BaseModel):
    """Published by an API process on ``<ns>.gen.<model>`` for a response still ``queued``
    well after it was stored, with the response id as its message id, as the response's
    work has: JetStream drops it as a duplicate where the work reached the queue, and keeps
    it only where it never did (the API that stored the response stopped before queuing
    it). A worker that takes it ends the response with an error."""

    kind: Literal["check"] = "check"
    v: Literal[1] = 1
    response_id: str
    model: str


GenerationWork = GenerationRequest | StoredGenerationRequest | QueueCheck
generation_work: TypeAdapter[GenerationWork] = TypeAdapter(Annotated[GenerationWork, Field(discriminator="kind")])


class MaxDeliveriesAdvisory(BaseModel):
    """JetStream's own message, not Steno's (so no ``v``): a consumer delivered the
    stream's message ``stream_seq`` as often as it may and will deliver it no more. The
    work stream's are kept in a stream of their own for the workers; JetStream's other
    fields pass through."""

    model_config = ConfigDict(extra="allow")

    type: Literal["io.nats.jetstream.advisory.v1.max_deliver"]
    id: str
    timestamp: str
    stream: str
    consumer: str
    stream_seq: int
    deliveries: int


class GenerationEnded(BaseModel):
    """Why an attempt stopped and what it cost: carried by its last TokenBatch (or, from
    earlier workers and for failures the parser records, a message of its own)."""

    kind: Literal["ended"] = "ended"
    v: Literal[1] = 1
    response_id: str
    attempt: int
    batch_count: int
    finish_reason: FinishReason
    prompt_tokens: int
    # All output tokens of the response, earlier attempts included.
    output_tokens: int
    cached_tokens: int | None = None
    error_code: str | None = None
    error_message: str | None = None
    # When it ended (unix seconds): the response's completed_at, recorded with the end so
    # that a re-parse reaches the same snapshot.
    completed_at: int | None = None


class TokenBatch(BaseModel):
    """A run of output tokens, coalesced by the worker. ``batch_no`` counts from 0 per attempt."""

    kind: Literal["tokens"] = "tokens"
    v: Literal[1] = 1
    response_id: str
    attempt: int
    batch_no: int
    token_ids: list[int]
    # On the first batch of a later attempt (a worker took the request over): how many
    # output tokens the earlier attempts had published, which this attempt continues.
    resumed_after: int | None = None
    # Parallel to token_ids when the request asked for logprobs.
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # On the first batch of the first attempt: the request's seed for the parser.
    parser_seed: ParserSeed | None = None
    # On the last batch of an attempt: the attempt's end (batch_count = batch_no + 1),
    # one message instead of two.
    ended: GenerationEnded | None = None
    # When the engine emitted the batch's last token (unix seconds, the worker's clock).
    emitted_at: float | None = None
    # When it emitted the batch's first token: how long the longest-waiting token took to
    # reach a client is measured from here (``steno bench --scenarios steady``).
    first_emitted_at: float | None = None


def token_batch_json(
    response_id: str, attempt: int, batch_no: int, token_ids: list[int], *, resumed_after: int | None = None,
    logprobs: list[float] | None = None, top_logprobs: list[list[tuple[int, float]]] | None = None,
    parser_seed_json: str | None = None, ended: GenerationEnded | None = None, emitted_at: float | None = None,
    first_emitted_at: float | None = None,
) -> bytes:
    """The batch as ``TokenBatch(...).model_dump_json(exclude_none=True)`` writes it, the
    same bytes, its seed given as the JSON the API wrote (``GenerationRequest``). A worker
    writes one per stream and engine step, and building the model to write it cost
    several times the writing (docs/performance.md, "Batches and announcements written
    without their models"), so it is written from its fields, the seed and the end
    spliced in as they are encoded."""
    # In TokenBatch's field order, as the model writes them.
    fields: dict[str, Any] = {"kind": "tokens", "v": 1, "response_id": response_id, "attempt": attempt,
                              "batch_no": batch_no, "token_ids": token_ids}
    for name, value in (("resumed_after", resumed_after), ("logprobs", logprobs), ("top_logprobs", top_logprobs),
                        ("parser_seed", None if parser_seed_json is None else orjson.Fragment(parser_seed_json)),
                        ("ended", None if ended is None else orjson.Fragment(ended.model_dump_json(exclude_none=True))),
                        ("emitted_at", emitted_at), ("first_emitted_at", first_emitted_at)):
        if value is not None:
            fields[name] = value
    return orjson.dumps(fields)


# What a response's token subject carries.
TokenStreamMessage = TokenBatch | GenerationEnded
token_stream_message: TypeAdapter[TokenStreamMessage] = TypeAdapter(
    Annotated[TokenStreamMessage, Field(discriminator="kind")]
)


class GroupedBatch(BaseModel):
    """One response's batch within a ``TokenBatchGroup``, with the headers it would have
    carried as a message of its own (trace context, tenant)."""

    headers: dict[str, str] = Field(default_factory=dict)
    batch: TokenBatch


class TokenBatchGroup(BaseModel):
    """Token batches of several responses of one token partition that a worker had ready
    at the same moment (an engine's step makes a token for every running request at
    once), in one message on the partition's group subject
    (``<ns>.tokens.<partition>.grouped``) instead of one message each: one store, one
    acknowledgement and one delivery for them all. At most one batch per response, and
    only of responses whose output may outlive them on the bus (``GenerationRequest.groupable``)."""

    kind: Literal["group"] = "group"
    v: Literal[1] = 1
    batches: list[GroupedBatch]


# What a token partition carries: a response's own messages, and groups of batches.
TokenPartitionMessage = TokenBatch | GenerationEnded | TokenBatchGroup
token_partition_message: TypeAdapter[TokenPartitionMessage] = TypeAdapter(
    Annotated[TokenPartitionMessage, Field(discriminator="kind")]
)


def unpacked(message: TokenPartitionMessage, headers: dict[str, str] | None
             ) -> list[tuple[TokenStreamMessage, dict[str, str] | None]]:
    """The token stream messages a partition message carries, each with its headers."""
    if isinstance(message, TokenBatchGroup):
        return [(grouped.batch, grouped.headers) for grouped in message.batches]
    return [(message, headers)]


def end_of(message: TokenStreamMessage) -> GenerationEnded | None:
    """The attempt's end that a token stream message carries, if it carries one."""
    return message if isinstance(message, GenerationEnded) else message.ended


def stream_position(message: TokenStreamMessage) -> tuple[int, int]:
    """Where a message stands in its response's token stream: its attempt, then its
    batch number (an attempt's end counting as the number after its last batch)."""
    return message.attempt, message.batch_no if isinstance(message, TokenBatch) else message.batch_count


class Placement(Enum):
    NEXT = "next"
    # Seen before (a redelivery): nothing to do.
    DUPLICATE = "duplicate"
    # A message it follows has not come yet.
    AHEAD = "ahead"
    # A later attempt that does not continue after every token published before it (a
    # worker that was thought dead published more after the takeover read the stream).
    DIVERGED = "diverged"


@dataclass
class TokenStreamOrder:
    """Where a response's token stream stands, and the one rule for what may come next,
    which the parser and a worker taking a request over both follow: messages apply in
    strictly increasing (attempt, batch number) order, a batch's end counting as the
    attempt's next number; a later attempt starts again at 0 and continues after every
    token before it; nothing applies after an end."""

    attempt: int = 0
    next_batch_no: int = 0
    output_tokens: int = 0
    ended: bool = False

    def place(self, message: TokenStreamMessage) -> Placement:
        _, number = position = stream_position(message)
        if self.ended or position < (self.attempt, self.next_batch_no):
            return Placement.DUPLICATE
        if message.attempt == self.attempt and number == self.next_batch_no:
            return Placement.NEXT
        if message.attempt > self.attempt and number == 0:
            resumed = message.resumed_after if isinstance(message, TokenBatch) else None
            return Placement.NEXT if resumed in (None, self.output_tokens) else Placement.DIVERGED
        return Placement.AHEAD

    def advance(self, message: TokenStreamMessage) -> None:
        """Moves past ``message``, which was placed next (a batch's own end is a step of
        its own)."""
        if message.attempt != self.attempt:
            self.attempt, self.next_batch_no = message.attempt, 0
        if isinstance(message, GenerationEnded):
            self.ended = True
        else:
            self.next_batch_no += 1
            self.output_tokens += len(message.token_ids)


class CancelOrder(BaseModel):
    """The value of a response's key in the cancel bucket; every worker watches it."""

    v: Literal[1] = 1
    response_id: str


class Takeover(BaseModel):
    """The value of a response's key in the takeovers bucket: the attempt that took its
    generation over from an earlier one whose worker stopped beating for it (frozen,
    paused by its host). Every worker watches the bucket; one still generating an
    earlier attempt of the response stops it, since the parser drops what it publishes
    after the later attempt's first batch."""

    v: Literal[1] = 1
    response_id: str
    attempt: int


class WorkerRegistration(BaseModel):
    """The value of a model's key in the worker registry, refreshed by every worker that
    serves the model: the API renders that model's requests in ``dialect`` and refuses
    a prompt that leaves no room in ``context_tokens`` (the tokens a prompt and its
    output may hold together)."""

    v: Literal[1] = 1
    model: str
    engine: str
    dialect: str
    context_tokens: int
    # When the first worker of the model started (unix seconds): the model's "created".
    created: int = 0
    # A chat-template model's tokenizer and template (ChatTemplateFiles), by digest in
    # the model files store: the API and the parser read them from there, so that only
    # workers need the model's directory.
    dialect_files: str | None = None


class ChatTemplateFiles(BaseModel):
    """What Steno needs of a chat-template model's directory to render its prompts and
    read its output, published by its workers into the model files store under its
    ``digest()``, and never changed there: a response records the digest, so that its
    tokens are re-parsed (``steno audit``) with the very files it was made with."""

    v: Literal[1] = 1
    # The model's family (services/dialects/chat_template/families.py): the template
    # arguments reasoning.effort maps to.
    family: str
    # The Hugging Face tokenizer (tokenizer.json) and the chat template, as text.
    tokenizer: str
    chat_template: str
    # Template variables such as bos_token and eos_token.
    template_tokens: dict[str, str] = Field(default_factory=dict)
    # Tokens that end the model's turn.
    stop_tokens: list[str]
    # The reasoning block's opening and closing tags, for a model that reasons.
    reasoning_tags: tuple[str, str] | None = None
    # How the model writes tool calls (services/dialects/chat_template/tool_calls.py).
    tool_call_format: str

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()
