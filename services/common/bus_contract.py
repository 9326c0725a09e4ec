"""The bus contract: every subject, stream, consumer and KV bucket Steno uses, with the
message each carries, as an AsyncAPI 3.0 document (``GET /asyncapi.json``,
``steno asyncapi``, committed as ``docs/asyncapi.json``).

Each channel is declared as a FastStream publisher whose schema is the very pydantic
model the services send (``schemas/``), and FastStream writes the document. What
AsyncAPI's NATS binding has no field for (the JetStream stream behind a subject, its
consumers, a KV bucket, who publishes and who reads) is added under ``x-steno`` on the
channel, and each consumer or subscription as a ``receive`` operation. Subjects are
templates: ``{model}`` and the like are channel parameters.

The declarations only describe: the broker never connects. The services publish and
subscribe with nats-py (docs/architecture.md says why).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import version
from typing import Annotated, Any, Literal

from faststream.nats import JStream, NatsBroker
from faststream.specification import AsyncAPI
from pydantic import BaseModel, Field

from steno.schemas.bus import (
    CancelOrder,
    ChatTemplateFiles,
    GenerationRequest,
    GenerationWork,
    MaxDeliveriesAdvisory,
    Takeover,
    TokenBatchGroup,
    TokenStreamMessage,
    WorkerRegistration,
)
from steno.schemas.events import AnnouncedEvents
from steno.services.common.bus import (
    AFFINITY_SHARDS,
    CANCEL_FLAG_TTL_S,
    DUPLICATE_WINDOW_S,
    FOLLOW_TTL_S,
    TAKEOVER_TTL_S,
    TOKENS_MAX_AGE_S,
    WORK_DUPLICATE_WINDOW_S,
    WORKER_REGISTRATION_TTL_S,
    Names,
)
from steno.services.common.config import Settings
from steno.services.common.leases import LEASE_TTL_S
from steno.services.common.tracing import TENANT_HEADER, TRACEPARENT

DEFAULT_NAMESPACE = "steno"
REGENERATE = "steno asyncapi > docs/asyncapi.json"

# Channel parameters: what each template part of a subject stands for.
PARAMETERS = {
    "model": "The model's name as one subject token (bus.model_token: letters, digits and '-' as they are, "
             "any other character as _<hex code>_).",
    "shard": f"An affinity shard of the model: crc32(tenant, prompt_cache_key) mod {AFFINITY_SHARDS}.",
    "partition": "A token partition, 0 to STENO_TOKEN_PARTITIONS - 1: crc32(response_id) mod the partitions.",
    "response_id": "The response's id (resp_...).",
    "origin": "The API process that made the response: the eight hex characters after resp_ in its id.",
    "instance_id": "A live holder: host, pid and a random part (a host name with dots spans several tokens).",
    "consumer": "A work consumer: worker-{model}, or worker-{model}-affinity-{shard}.",
}
# Parameters whose one token has a shape of its own (a response id is never ``grouped``).
PARAMETER_PATTERNS = {"response_id": "resp_[^.]+"}
# Parameters whose value may hold dots, so span more than one subject token.
MULTI_TOKEN_PARAMETERS = frozenset({"instance_id"})
# What a message about one response carries beside its id (services/common/tracing.py).
RESPONSE_HEADERS = {
    TRACEPARENT: "W3C trace context of the response's trace (present when the publisher traces)",
    "tracestate": "W3C trace state that goes with traceparent, when there is any",
    TENANT_HEADER: "the tenant the response belongs to, for the receiver's log lines",
}

Service = Literal["api", "worker", "parser"]
# JetStream publishes its advisories itself.
Publisher = Service | Literal["jetstream"]


@dataclass(frozen=True)
class BusMessages:
    """What each kind of message is: the models in ``schemas/``. A check that the document
    notices a changed model passes another model in one's place."""

    generation_work: Any = Annotated[GenerationWork, Field(discriminator="kind")]
    token_stream: Any = Annotated[TokenStreamMessage, Field(discriminator="kind")]
    token_batch_group: type[BaseModel] = TokenBatchGroup
    announced_events: type[BaseModel] = AnnouncedEvents
    cancel_order: type[BaseModel] = CancelOrder
    takeover: type[BaseModel] = Takeover
    worker_registration: type[BaseModel] = WorkerRegistration
    stored_request: type[BaseModel] = GenerationRequest
    model_files: type[BaseModel] = ChatTemplateFiles
    max_deliveries_advisory: type[BaseModel] = MaxDeliveriesAdvisory


@dataclass(frozen=True)
class Receiver:
    """Who reads a channel: a JetStream consumer (``durable`` its name, empty for an
    ephemeral one) or, on core NATS, a subscription to ``subject``."""

    service: Service
    subject: str
    description: str
    durable: str = ""
    ack: Literal["explicit", "none"] | None = None


@dataclass(frozen=True)
class Channel:
    key: str
    subject: str
    payload: Any
    description: str
    publishers: tuple[Publisher, ...]
    receivers: tuple[Receiver, ...] = ()
    # The JetStream stream (or KV bucket) behind the subject; None for core NATS.
    stream: dict[str, Any] | None = None
    bucket: dict[str, Any] | None = None
    # A KV value that is not JSON.
    text: bool = False
    headers: dict[str, str] = field(default_factory=dict)


def channels(namespace: str, messages: BusMessages) -> list[Channel]:
    ns = namespace
    names = Names(namespace, token_partitions=1)
    gen_stream = {"name": names.gen_stream, "subjects": [f"{ns}.gen.>"], "retention": "workqueue",
                  "storage": "file", "duplicate_window_s": WORK_DUPLICATE_WINDOW_S}
    tokens_stream = {"name": names.tokens_stream, "subjects": [f"{ns}.tokens.>"], "retention": "limits",
                     "storage": "file", "max_age_s": TOKENS_MAX_AGE_S, "duplicate_window_s": DUPLICATE_WINDOW_S}
    exhausted_stream = {"name": names.exhausted_work_stream, "subjects": [names.exhausted_work_advisories()],
                        "retention": "workqueue", "storage": "file"}
    kv_delete = ("A delete or purge (KV-Operation DEL or PURGE) carries no body; a key also lapses "
                 "silently after the bucket's TTL.")

    def kv(bucket: str, ttl_s: float, key: str) -> dict[str, Any]:
        return {"name": bucket, "stream": f"KV_{bucket}", "ttl_s": ttl_s, "history": 1, "key": key,
                "deletes": kv_delete}

    return [
        Channel(
            "generation-work", f"{ns}.gen.{{model}}", messages.generation_work,
            "Work for the model's workers, one message per response (a StoredGenerationRequest names a request "
            "too large for a message, kept in the requests object store). A QueueCheck, which an API process "
            "publishes for a response queued a while, with the response id as its message id, is stored only "
            "where the response's work never was.",
            publishers=("api",), stream=gen_stream, headers={"Nats-Msg-Id": "the response id", **RESPONSE_HEADERS},
            receivers=(Receiver("worker", f"{ns}.gen.{{model}}", "Every worker of the model pulls from it "
                                "(a standing pull request, as many messages as free generation slots).",
                                durable="worker-{model}", ack="explicit"),),
        ),
        Channel(
            "generation-work-affinity", f"{ns}.gen.{{model}}.affinity.{{shard}}", messages.generation_work,
            "Work with a prompt_cache_key, routed to the shard of the tenant's key, which one worker of the "
            "model holds (the affinity leases bucket).",
            publishers=("api",), stream=gen_stream, headers={"Nats-Msg-Id": "the response id", **RESPONSE_HEADERS},
            receivers=(Receiver("worker", f"{ns}.gen.{{model}}.affinity.{{shard}}",
                                "The worker holding the shard's lease pulls from it.",
                                durable="worker-{model}-affinity-{shard}", ack="explicit"),),
        ),
        Channel(
            "exhausted-work", names.exhausted_work_advisories().replace("*", "{consumer}"),
            messages.max_deliveries_advisory,
            "JetStream's advisory that a work consumer delivered a request as often as it may (each worker that "
            "took it stopped with it before its end) and will deliver it no more; kept until a worker has ended "
            "the response with an error and taken the request off the work stream.",
            publishers=("jetstream",), stream=exhausted_stream,
            receivers=(Receiver("worker", names.exhausted_work_advisories(), "Every worker, of any model, pulls "
                                "from it (a standing pull request), acking once the response's end is published "
                                "and the request deleted.", durable=names.exhausted_work_consumer,
                                ack="explicit"),),
        ),
        Channel(
            "token-stream", f"{ns}.tokens.{{partition}}.{{response_id}}", messages.token_stream,
            "A response's output tokens in batches; the last of an attempt carries its GenerationEnded. "
            "The API publishes a GenerationEnded of its own for a cancel no worker ended.",
            publishers=("worker", "api"), stream=tokens_stream,
            headers={"Nats-Msg-Id": "<response_id>:<attempt>:<batch_no> (a cancel's end: "
                                    "<response_id>:cancelled:<attempt>:<batch_no>)", **RESPONSE_HEADERS},
            receivers=(
                Receiver("parser", f"{ns}.tokens.{{partition}}.>", "The parser holding the partition's lease "
                         "pulls from it, acking after the Postgres commit.", durable="parser-p{partition}",
                         ack="explicit"),
                Receiver("worker", f"{ns}.tokens.{{partition}}.{{response_id}}", "A worker taking a request "
                         "over reads what earlier attempts published (an ephemeral consumer).", ack="none"),
            ),
        ),
        Channel(
            "token-batch-groups", f"{ns}.tokens.{{partition}}.grouped", messages.token_batch_group,
            "Batches of several responses of the partition that a worker had ready at the same moment, in one "
            "message (at most one batch per response; only responses stored with store=true). A batch that "
            "finds no company goes on its response's own subject.",
            publishers=("worker",), stream=tokens_stream,
            headers={"Nats-Msg-Id": "group:<the first batch's message id>"},
            receivers=(
                Receiver("parser", f"{ns}.tokens.{{partition}}.>", "The parser holding the partition's lease "
                         "pulls from it, acking once every batch of the group is committed.",
                         durable="parser-p{partition}", ack="explicit"),
                Receiver("worker", f"{ns}.tokens.{{partition}}.grouped", "A worker taking a request over reads "
                         "the groups stored since the request was queued (an ephemeral consumer).", ack="none"),
            ),
        ),
        Channel(
            "announced-events", f"{ns}.events.{{origin}}", messages.announced_events,
            "The events of each response the API process made or follows, announced on core NATS right after "
            "the parser commits them to Postgres, for live tails: one message per commit (more only where the "
            "size limit asks).",
            publishers=("parser",),
            receivers=(Receiver("api", f"{ns}.events.{{origin}}", "Each API process, on its own origin."),),
        ),
        Channel(
            "followers", f"$KV.{names.followers_bucket}.{{response_id}}.{{origin}}", str,
            "The API process follows a response another one made (the value is 1), so that the parser announces "
            "its events to that process too; deleted when the last of its streams of the response ends, "
            "refreshed meanwhile.",
            publishers=("api",), text=True, bucket=kv(names.followers_bucket, FOLLOW_TTL_S, "{response_id}.{origin}"),
            receivers=(Receiver("parser", f"$KV.{names.followers_bucket}.>", "Every parser watches the bucket "
                                "into memory (kv_mirror)."),),
        ),
        Channel(
            "cancel-orders", f"$KV.{names.cancel_bucket}.{{response_id}}", messages.cancel_order,
            "The response's cancellation was asked for.",
            publishers=("api",), bucket=kv(names.cancel_bucket, CANCEL_FLAG_TTL_S, "{response_id}"),
            receivers=(Receiver("worker", f"$KV.{names.cancel_bucket}.>", "Every worker watches the bucket "
                                "into memory (kv_mirror)."),),
        ),
        Channel(
            "takeovers", f"$KV.{names.takeovers_bucket}.{{response_id}}", messages.takeover,
            "A later attempt took the response's generation over (its request redelivered after the worker of "
            "an earlier one stopped beating for it); a worker still generating an earlier attempt stops it.",
            publishers=("worker",), bucket=kv(names.takeovers_bucket, TAKEOVER_TTL_S, "{response_id}"),
            receivers=(Receiver("worker", f"$KV.{names.takeovers_bucket}.>", "Every worker watches the bucket "
                                "into memory (kv_mirror)."),),
        ),
        Channel(
            "worker-registrations", f"$KV.{names.workers_bucket}.{{model}}", messages.worker_registration,
            "A model some live worker serves, refreshed by each of its workers.",
            publishers=("worker",), bucket=kv(names.workers_bucket, WORKER_REGISTRATION_TTL_S, "{model}"),
            receivers=(Receiver("api", f"$KV.{names.workers_bucket}.>", "Every API process watches the bucket "
                                "into memory (kv_mirror)."),),
        ),
        Channel(
            "parser-leases", f"$KV.{names.parser_leases_bucket}.p{{partition}}", str,
            "The instance id of the parser holding the token partition (created to claim, updated by "
            "revision to renew).",
            publishers=("parser",), text=True, bucket=kv(names.parser_leases_bucket, LEASE_TTL_S, "p{partition}"),
        ),
        Channel(
            "parsers", f"$KV.{names.parsers_bucket}.{{instance_id}}", str,
            "A live parser (the value is 1): the parsers share the partitions out by their count.",
            publishers=("parser",), text=True, bucket=kv(names.parsers_bucket, LEASE_TTL_S, "{instance_id}"),
        ),
        Channel(
            "affinity-leases", f"$KV.{names.affinity_leases_bucket}.{{model}}.p{{shard}}", str,
            "The instance id of the worker holding the model's affinity shard.",
            publishers=("worker",), text=True,
            bucket=kv(names.affinity_leases_bucket, LEASE_TTL_S, "{model}.p{shard}"),
        ),
        Channel(
            "affinity-holders", f"$KV.{names.affinity_holders_bucket}.{{model}}.{{instance_id}}", str,
            "A live worker of the model (the value is 1): the model's workers share its shards out by their "
            "count.",
            publishers=("worker",), text=True,
            bucket=kv(names.affinity_holders_bucket, LEASE_TTL_S, "{model}.{instance_id}"),
        ),
        Channel(
            "presence", f"{names.presence_prefix}.{{instance_id}}", str,
            "A probe of a lease holder (parser or worker), empty, as a request: the holder answers it with an "
            "empty reply while its process lives. NATS refusing it (no responders) means the holder's connection "
            "is gone, and its leases are freed without waiting for their TTL.",
            publishers=("worker", "parser"), text=True,
            receivers=(Receiver("worker", f"{names.presence_prefix}.{{instance_id}}", "Each worker, on its own "
                                "instance id."),
                       Receiver("parser", f"{names.presence_prefix}.{{instance_id}}", "Each parser, on its own "
                                "instance id.")),
        ),
    ]


def _object_stores(names: Names) -> dict[str, Any]:
    return {
        names.requests_store: {
            "description": "Generation requests too large for a message, by response id (the name a "
                           "StoredGenerationRequest gives); they expire with the token streams.",
            "ttl_s": TOKENS_MAX_AGE_S, "content": {"$ref": "#/components/schemas/GenerationRequest"},
            "written_by": ["api"], "read_by": ["worker"],
        },
        names.model_files_store: {
            "description": "Chat-template models' files, by the sha256 digest a WorkerRegistration names; "
                           "never changed once stored.",
            "content": {"$ref": "#/components/schemas/ChatTemplateFiles"},
            "written_by": ["worker"], "read_by": ["api", "parser"],
        },
    }


# Subjects of JetStream's own API, which carry no message of Steno's: stream and consumer
# requests, pull requests and acks, events (but for the work stream's max-deliveries
# advisories, a channel of their own), replies, and the object stores' chunks and
# metadata (an object's content is described under x-steno-object-stores).
JETSTREAM_INTERNAL = ["$JS.API.>", "$JS.ACK.>", "$JS.FC.>", "$JS.EVENT.>", "_INBOX.>", "$O.>"]


def _broker(channel_list: list[Channel]) -> NatsBroker:
    broker = NatsBroker(Settings.model_fields["nats_url"].default)
    for channel in channel_list:
        stream = channel.stream["name"] if channel.stream else channel.bucket["stream"] if channel.bucket else None
        broker.publisher(channel.subject, schema=channel.payload, title=channel.key,
                         description=channel.description,
                         stream=JStream(stream, declare=False) if stream else None)
    return broker


def asyncapi_document(namespace: str = DEFAULT_NAMESPACE, messages: BusMessages = BusMessages()) -> dict[str, Any]:
    """The bus contract of a deployment in ``namespace`` as an AsyncAPI document (JSON)."""
    channel_list = channels(namespace, messages)
    specification = AsyncAPI(
        _broker(channel_list), title="Steno bus", version=version("steno"), schema_version="3.0.0",
        description=f"Every NATS subject, stream, consumer and KV bucket of the namespace {namespace}, with "
                    f"the message each carries. Regenerate the committed copy with `{REGENERATE}`.",
    )
    document: dict[str, Any] = json.loads(json.dumps(specification.to_specification().to_jsonable()))
    for channel in channel_list:
        _annotate(document, channel)
    # Objects are no channel's message: their models join the schemas here.
    for model in (messages.stored_request, messages.model_files):
        _add_schema(document, model)
    document["x-steno-object-stores"] = _object_stores(Names(namespace, token_partitions=1))
    document["x-jetstream-internal"] = {
        "description": "Subjects of JetStream's own API: no message of Steno's travels on them.",
        "subjects": JETSTREAM_INTERNAL,
    }
    return document


def _add_schema(document: dict[str, Any], model: type[BaseModel]) -> None:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas = document["components"]["schemas"]
    for name, definition in schema.pop("$defs", {}).items():
        schemas.setdefault(name, definition)
    schemas.setdefault(model.__name__, schema)


def _annotate(document: dict[str, Any], channel: Channel) -> None:
    """Adds what FastStream's NATS binding has no place for: parameters, the stream or
    bucket, publishers and receivers, headers, and a receive operation per reader."""
    entry = document["channels"][channel.key]
    parameters = re.findall(r"{(\w+)}", channel.subject)
    if parameters:
        entry["parameters"] = {name: _parameter(name) for name in parameters}
    facts: dict[str, Any] = {"publishers": list(channel.publishers), "transport": "core NATS"}
    if channel.stream is not None:
        facts |= {"transport": "JetStream", "stream": channel.stream}
    if channel.bucket is not None:
        facts |= {"transport": "JetStream KV", "bucket": channel.bucket}
    entry["x-steno"] = facts
    message = document["components"]["messages"][f"{channel.key}:Message"]
    # Steno sends no correlation id.
    message.pop("correlationId", None)
    message["contentType"] = "text/plain" if channel.text else "application/json"
    headers = dict(channel.headers)
    if channel.bucket is not None:
        headers["KV-Operation"] = "DEL or PURGE on a delete marker, which has no body"
    if headers:
        message["headers"] = {"type": "object",
                              "properties": {name: {"type": "string", "description": meaning}
                                             for name, meaning in headers.items()}}
    for number, receiver in enumerate(channel.receivers):
        operation: dict[str, Any] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{channel.key}"},
            "messages": [{"$ref": f"#/channels/{channel.key}/messages/Message"}],
            "description": receiver.description,
            "x-steno": {"service": receiver.service, "subject": receiver.subject},
        }
        if receiver.ack is not None:
            operation["x-steno"] |= {"consumer": receiver.durable or "(ephemeral)", "ack": receiver.ack}
        document["operations"][f"{channel.key}:receive:{number}"] = operation


def _parameter(name: str) -> dict[str, Any]:
    described: dict[str, Any] = {"description": PARAMETERS[name]}
    if name in MULTI_TOKEN_PARAMETERS:
        described["x-subject-tokens"] = "one or more"
    if name in PARAMETER_PATTERNS:
        described["x-subject-token-pattern"] = PARAMETER_PATTERNS[name]
    return described


@cache
def rendered_document(namespace: str) -> str:
    """The document as served, made once per process and namespace."""
    return render(asyncapi_document(namespace))


def render(document: dict[str, Any]) -> str:
    """The document as committed: sorted keys, so a regeneration changes only what changed."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def template_pattern(template: str) -> re.Pattern[str]:
    """A subject template as a pattern for concrete subjects: a parameter is one subject
    token (or several, for MULTI_TOKEN_PARAMETERS), ``*`` and ``>`` as NATS means them."""
    parts = re.split(r"({\w+})", template)
    pattern = ""
    for part in parts:
        name = part[1:-1] if part.startswith("{") else None
        if name is not None:
            pattern += ".+" if name in MULTI_TOKEN_PARAMETERS else PARAMETER_PATTERNS.get(name, "[^.]+")
            continue
        pattern += re.escape(part).replace(r"\*", "[^.]+").replace(">", ".+")
    return re.compile(pattern)


def channels_of(document: dict[str, Any], subject: str) -> list[str]:
    """The document's channels whose address ``subject`` is an instance of."""
    return [key for key, channel in document["channels"].items()
            if template_pattern(channel["address"]).fullmatch(subject)]


def differences(old: Any, new: Any, path: str = "") -> Iterator[str]:
    """Where ``new`` differs from ``old`` (say, the document the models make from the
    committed copy), as paths (pure)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys()):
            where = f"{path}/{key}"
            if key not in new:
                yield f"{where}: removed"
            elif key not in old:
                yield f"{where}: added"
            else:
                yield from differences(old[key], new[key], where)
    elif old != new:
        yield f"{path or '/'}: {json.dumps(old)[:200]} -> {json.dumps(new)[:200]}"
