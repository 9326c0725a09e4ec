"""NATS naming and set-up shared by every service.

Subjects (``ns`` is the deployment namespace):
  ``ns.gen.<model>``                       GenerationRequest, work-queue stream ``NS_GEN``
  ``ns.gen.<model>.affinity.<shard>``      the same, for requests with a ``prompt_cache_key``
  ``ns.tokens.<p>.<response_id>``          TokenBatch (the last carries its GenerationEnded), stream ``NS_TOKENS``
                                           (its description names the partition count, which a process
                                           not set to a count takes and one set to another refuses)
  ``ns.events.<origin>``                   AnnouncedEvents, core NATS (``origin``: an API process; the
                                           responses it made and those it follows)
KV buckets: ``ns_cancel`` (CancelOrder per response), ``ns_takeovers`` (Takeover per
response taken over by a later attempt), ``ns_workers`` (WorkerRegistration per
model), ``ns_followers`` (API processes following responses made elsewhere, key
``<response_id>.<origin>``), ``ns_parser_leases`` and ``ns_parsers`` (token partitions' holders),
``ns_affinity_leases`` and ``ns_affinity_holders`` (each model's affinity shards' workers).
Object stores: ``ns_requests`` (requests too large for a message), ``ns_model_files``
(chat-template models' files, by digest).
"""

from __future__ import annotations

import asyncio
import logging
import re
import string
import zlib
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TypeVar

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    ObjectStoreConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError, ServiceUnavailableError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from steno.services.common.config import Settings
from steno.services.common.nats_options import NatsOptions, open_connection

log = logging.getLogger(__name__)

# How long a consumer waits for an ack (or an in-progress heartbeat) before redelivering.
ACK_WAIT_S = 30.0
# Token messages are only needed until the parser has committed them; keep them a while
# longer so an operator can inspect a stuck response.
TOKENS_MAX_AGE_S = 24 * 3600
DUPLICATE_WINDOW_S = 120
# The work stream's: the queue checks (services/api/queue_checks.py) tell work that never
# reached the queue from work waiting there only within it, so it outlasts an API
# process's restart after a crash, backoff included. NATS keeps every message id of the
# window, a few hundred bytes each (docs/performance.md, "The work stream's duplicate
# window").
WORK_DUPLICATE_WINDOW_S = 600
# A cancel flag outlives any request that could still be waiting in the queue.
CANCEL_FLAG_TTL_S = 24 * 3600
# An earlier attempt is worth stopping for as long as its output could still be read.
TAKEOVER_TTL_S = TOKENS_MAX_AGE_S
# Workers refresh their model's registration this often; it lapses after the TTL.
WORKER_REGISTRATION_EVERY_S = 3.0
WORKER_REGISTRATION_TTL_S = 10.0
# Followers refresh their keys well within it; a dead process's keys lapse after it.
FOLLOW_TTL_S = 600.0
# Each model's requests with a prompt_cache_key are spread over this many shards, which
# its workers share out between them as leases.
AFFINITY_SHARDS = 8
# How long a starting process asks JetStream again while it is unavailable or slow to
# answer, before giving up (and exiting, for its supervisor to start it again).
START_PATIENCE_S = 60.0
START_RETRY_FIRST_S = 0.1
START_RETRY_MOST_S = 2.0

T = TypeVar("T")


@lru_cache(maxsize=1024)
def model_token(model: str) -> str:
    """A model name as one NATS subject token: letters, digits and '-' as they are, any
    other character as ``_<hex code>_``, so that two names never share a token."""
    return "".join(c if c in _TOKEN_SAFE else f"_{ord(c):x}_" for c in model)


_TOKEN_SAFE = frozenset(string.ascii_letters + string.digits + "-")


def partition_of(response_id: str, partitions: int) -> int:
    return zlib.crc32(response_id.encode()) % partitions


def affinity_shard(tenant: str, prompt_cache_key: str, shards: int) -> int:
    """The shard a tenant's ``prompt_cache_key`` routes to: one worker of the model holds
    each shard, so requests that share a key share that worker's prefix cache."""
    return zlib.crc32(f"{tenant}\0{prompt_cache_key}".encode()) % shards


_PARSER_CONSUMER_PREFIX = "parser-p"


@dataclass(frozen=True)
class Names:
    namespace: str
    token_partitions: int
    replicas: int = 1
    affinity_shards: int = AFFINITY_SHARDS
    # Whether ``token_partitions`` was asked for (STENO_TOKEN_PARTITIONS), rather than
    # the default, which gives way to the count an existing token stream was made for.
    partitions_chosen: bool = True

    @property
    def gen_stream(self) -> str:
        return f"{self.namespace.upper()}_GEN"

    @property
    def tokens_stream(self) -> str:
        return f"{self.namespace.upper()}_TOKENS"

    def gen_subject(self, model: str) -> str:
        return f"{self.namespace}.gen.{model_token(model)}"

    def worker_consumer(self, model: str) -> str:
        return f"worker-{model_token(model)}"

    def gen_affinity_subject(self, model: str, shard: int) -> str:
        """Requests with a ``prompt_cache_key``, for whichever worker holds their shard."""
        return f"{self.namespace}.gen.{model_token(model)}.affinity.{shard}"

    def affinity_consumer(self, model: str, shard: int) -> str:
        return f"worker-{model_token(model)}-affinity-{shard}"

    def exhausted_work_advisories(self) -> str:
        """JetStream's advisories of requests that a work consumer will deliver no more,
        having delivered them as often as it may (one subject per consumer)."""
        return f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{self.gen_stream}.*"

    @property
    def exhausted_work_stream(self) -> str:
        """Keeps those advisories until a worker has ended their responses: JetStream says
        each once, to whoever listens at that moment, which may be no worker at all."""
        return f"{self.namespace.upper()}_GEN_EXHAUSTED"

    @property
    def exhausted_work_consumer(self) -> str:
        """Shared by every worker, of any model: ending such a response needs no engine."""
        return "workers"

    def tokens_subject(self, response_id: str) -> str:
        return f"{self.namespace}.tokens.{partition_of(response_id, self.token_partitions)}.{response_id}"

    def tokens_group_subject(self, partition: int) -> str:
        """Token batches of several responses of the partition (``TokenBatchGroup``);
        ``grouped`` is no response id."""
        return f"{self.namespace}.tokens.{partition}.grouped"

    def tokens_partition_filter(self, partition: int) -> str:
        return f"{self.namespace}.tokens.{partition}.>"

    def parser_consumer(self, partition: int) -> str:
        return f"{_PARSER_CONSUMER_PREFIX}{partition}"

    @staticmethod
    def parser_consumer_partition(durable: str) -> int | None:
        """The partition a ``parser_consumer`` name reads; None for any other name."""
        partition = durable.removeprefix(_PARSER_CONSUMER_PREFIX)
        return int(partition) if partition != durable and partition.isdecimal() else None

    def events_subject(self, origin: str) -> str:
        """Committed events of every response one API process made or follows."""
        return f"{self.namespace}.events.{origin}"

    @property
    def presence_prefix(self) -> str:
        """Each lease holder answers on ``<prefix>.<instance_id>`` while its process lives."""
        return f"{self.namespace}.presence"

    @property
    def cancel_bucket(self) -> str:
        return f"{self.namespace}_cancel"

    @property
    def takeovers_bucket(self) -> str:
        return f"{self.namespace}_takeovers"

    @property
    def workers_bucket(self) -> str:
        return f"{self.namespace}_workers"

    @property
    def followers_bucket(self) -> str:
        return f"{self.namespace}_followers"

    @property
    def parser_leases_bucket(self) -> str:
        return f"{self.namespace}_parser_leases"

    @property
    def parsers_bucket(self) -> str:
        return f"{self.namespace}_parsers"

    @property
    def affinity_leases_bucket(self) -> str:
        return f"{self.namespace}_affinity_leases"

    @property
    def affinity_holders_bucket(self) -> str:
        return f"{self.namespace}_affinity_holders"

    @property
    def buckets(self) -> tuple[str, ...]:
        """Every KV bucket of the namespace."""
        return (self.cancel_bucket, self.takeovers_bucket, self.workers_bucket, self.followers_bucket,
                self.parser_leases_bucket, self.parsers_bucket, self.affinity_leases_bucket,
                self.affinity_holders_bucket)

    @property
    def requests_store(self) -> str:
        return f"{self.namespace}_requests"

    @property
    def model_files_store(self) -> str:
        return f"{self.namespace}_model_files"

    @classmethod
    def from_settings(cls, settings: Settings) -> Names:
        return cls(settings.namespace, settings.token_partitions, settings.stream_replicas,
                   partitions_chosen=settings.token_partitions_chosen)


async def connect(nats_config: Settings | NatsOptions, name: str, *, max_reconnect_attempts: int = -1) -> Client:
    """Connects to every server of ``STENO_NATS_URL`` with the settings' credentials and
    TLS (``nats_options``); NatsSettingsError or NatsRefused say what to fix."""
    options = nats_config if isinstance(nats_config, NatsOptions) else NatsOptions.from_settings(nats_config)
    return await open_connection(options, name, max_reconnect_attempts=max_reconnect_attempts)


def unanswered(error: BaseException) -> bool:
    """Whether a JetStream request failed only for want of an answer in time: JetStream
    still starting (no responders, 503) or a server too busy to answer within the
    request's timeout. Asking again may succeed; any other error would come again."""
    return isinstance(error, NatsTimeoutError | NoRespondersError | ServiceUnavailableError)


async def patiently(request: Callable[[], Awaitable[T]], what: str,
                    patience_s: float = START_PATIENCE_S) -> T:
    """Makes a JetStream set-up request, asking again while it goes unanswered, for at
    most ``patience_s``. The connection already waits for a server still starting; the
    set-up after it waits for its JetStream too, so that one late answer on a loaded
    machine does not end a process that is starting. Requests made this way must be
    safe to repeat: the unanswered one may have taken effect."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience_s
    delay = START_RETRY_FIRST_S
    while True:
        try:
            return await request()
        except Exception as error:
            if not unanswered(error):
                raise
            if loop.time() + delay > deadline:
                raise JetStreamUnanswered(
                    f"{what}: JetStream did not answer for {patience_s:g} s ({_why_unanswered(error)}); is "
                    "JetStream enabled on the NATS server (nats-server -js, or a jetstream block in its "
                    "configuration)?") from error
            log.warning("%s: JetStream did not answer (%s); asking again in %.1f s", what,
                        _why_unanswered(error), delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, START_RETRY_MOST_S)


class JetStreamUnanswered(RuntimeError):
    """A starting process gave up waiting for JetStream."""


def _why_unanswered(error: BaseException) -> str:
    if isinstance(error, NatsTimeoutError):
        return "no answer within the request's timeout"
    return "no JetStream is answering yet"


class PartitionCountMismatch(RuntimeError):
    """The token stream was made for another partition count than this process's."""


def _tokens_description(partitions: int) -> str:
    return f"Steno's token batches in {partitions} partitions (STENO_TOKEN_PARTITIONS)"


_DESCRIBED_PARTITIONS = re.compile(r" in (\d+) partitions ")


def _refuse_other_partitions(existing: StreamConfig, names: Names) -> None:
    """A worker set to more partitions than the parsers publishes batches on partitions
    no parser reads, and a parser set to fewer leaves some unread: responses stall
    without a word."""
    described = _DESCRIBED_PARTITIONS.search(existing.description or "")
    if described is not None and int(described.group(1)) != names.token_partitions:
        raise _mismatch(names, int(described.group(1)))


def _mismatch(names: Names, made_for: int) -> PartitionCountMismatch:
    return PartitionCountMismatch(
        f"the token stream {names.tokens_stream} was made for {made_for} partitions and this process is "
        f"set to {names.token_partitions} (STENO_TOKEN_PARTITIONS): every service of a deployment must use "
        "the same count, chosen before its first start (docs/deployment.md)")


async def _existing_partitions(js: JetStreamContext, names: Names) -> int | None:
    """The count the deployment's token stream was made for: as its description names
    it, or, for a stream from a release that did not name it, one more than the highest
    partition its parsers' consumers read; None for a new deployment."""
    try:
        existing = await js.stream_info(names.tokens_stream)
    except NotFoundError:
        return None
    described = _DESCRIBED_PARTITIONS.search(existing.config.description or "")
    if described is not None:
        return int(described.group(1))
    partitions = [partition for consumer in await js.consumers_info(names.tokens_stream)
                  if (partition := Names.parser_consumer_partition(consumer.config.durable_name or "")) is not None]
    return max(partitions) + 1 if partitions else None


async def deployment_names(js: JetStreamContext, names: Names) -> Names:
    """``names`` with the partition count of the deployment's token stream. A process
    set to a count of its own must match it (PartitionCountMismatch otherwise); one left
    at the default takes it, so the default applies to new deployments only and one made
    with another default keeps its count across an upgrade without naming it."""
    existing = await patiently(lambda: _existing_partitions(js, names), f"reading stream {names.tokens_stream}")
    if existing is None or existing == names.token_partitions:
        return names
    if names.partitions_chosen:
        raise _mismatch(names, existing)
    log.info("token stream %s: %d partitions, as it was made", names.tokens_stream, existing)
    return replace(names, token_partitions=existing)


async def _ensure_stream(js: JetStreamContext, config: StreamConfig,
                         accept: Callable[[StreamConfig], None] | None = None) -> None:
    """Declares the stream; one that exists with other settings is brought to ours, once
    ``accept`` (raising if not) has seen its own."""
    async def declare() -> None:
        try:
            await js.add_stream(config)
        except BadRequestError:
            if accept is not None and config.name is not None:
                accept((await js.stream_info(config.name)).config)
            await js.update_stream(config)

    await patiently(declare, f"declaring stream {config.name}")


async def ensure_streams(js: JetStreamContext, names: Names) -> None:
    """Declares the streams idempotently; every service calls this at start, with the
    names ``deployment_names`` gave it."""
    await _ensure_stream(
        js,
        StreamConfig(
            name=names.gen_stream,
            subjects=[f"{names.namespace}.gen.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            duplicate_window=WORK_DUPLICATE_WINDOW_S,
            num_replicas=names.replicas,
        ),
    )
    await _ensure_stream(
        js,
        StreamConfig(
            name=names.tokens_stream,
            # Names the partition count, which every process checks its own against.
            description=_tokens_description(names.token_partitions),
            subjects=[f"{names.namespace}.tokens.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=TOKENS_MAX_AGE_S,
            duplicate_window=DUPLICATE_WINDOW_S,
            num_replicas=names.replicas,
        ),
        lambda existing: _refuse_other_partitions(existing, names),
    )
    await _ensure_stream(
        js,
        StreamConfig(
            name=names.exhausted_work_stream,
            subjects=[names.exhausted_work_advisories()],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            num_replicas=names.replicas,
        ),
    )


async def kv_bucket(js: JetStreamContext, name: str, ttl_s: float, replicas: int = 1) -> KeyValue:
    """Opens a KV bucket, creating it on first use. A bucket made with another TTL (by an
    earlier release) takes this one: a TTL is the bucket's stream's age limit, fixed when
    it is created unless the stream is updated."""
    return await patiently(lambda: _open_kv_bucket(js, name, ttl_s, replicas), f"opening bucket {name}")


async def _open_kv_bucket(js: JetStreamContext, name: str, ttl_s: float, replicas: int) -> KeyValue:
    try:
        bucket = await js.key_value(name)
    except BucketNotFoundError:
        return await js.create_key_value(KeyValueConfig(bucket=name, ttl=ttl_s, history=1, replicas=replicas))
    stream = (await js.stream_info(f"KV_{name}")).config
    if stream.max_age != ttl_s:
        log.info("bucket %s: TTL %ss -> %ss", name, stream.max_age, ttl_s)
        stream.max_age = ttl_s
        # JetStream refuses a duplicate window longer than the age limit.
        stream.duplicate_window = min(stream.duplicate_window or ttl_s, ttl_s)
        await js.update_stream(stream)
    return bucket


async def cancel_flags(js: JetStreamContext, names: Names) -> KeyValue:
    """Responses whose cancellation was asked for (key: response id)."""
    return await kv_bucket(js, names.cancel_bucket, CANCEL_FLAG_TTL_S, names.replicas)


async def takeover_records(js: JetStreamContext, names: Names) -> KeyValue:
    """Responses whose generation a later attempt took over (key: response id)."""
    return await kv_bucket(js, names.takeovers_bucket, TAKEOVER_TTL_S, names.replicas)


async def worker_registry(js: JetStreamContext, names: Names) -> KeyValue:
    """Models some live worker serves (key: model token), refreshed by the workers."""
    return await kv_bucket(js, names.workers_bucket, WORKER_REGISTRATION_TTL_S, names.replicas)


async def follower_registry(js: JetStreamContext, names: Names) -> KeyValue:
    """API processes following responses made elsewhere (``services/common/followers.py``)."""
    return await kv_bucket(js, names.followers_bucket, FOLLOW_TTL_S, names.replicas)


async def request_store(js: JetStreamContext, names: Names) -> ObjectStore:
    """Generation requests too large for a bus message (``StoredGenerationRequest``),
    by response id; they expire with the token streams."""
    config = ObjectStoreConfig(bucket=names.requests_store, ttl=TOKENS_MAX_AGE_S, storage=StorageType.FILE,
                               replicas=names.replicas)
    return await patiently(lambda: object_store(js, config), f"opening object store {names.requests_store}")


async def object_store(js: JetStreamContext, config: ObjectStoreConfig) -> ObjectStore:
    """Opens an object store, creating it with ``config`` on first use (at once: a
    start-up that should wait for JetStream wraps it in ``patiently``)."""
    bucket = config.bucket or ""
    try:
        return await js.object_store(bucket)
    except BucketNotFoundError:
        return await js.create_object_store(bucket, config)


async def ensure_consumer(js: JetStreamContext, stream: str, config: ConsumerConfig) -> None:
    """Declares a durable consumer (idempotently: the same config again changes nothing)."""
    await patiently(lambda: js.add_consumer(stream, config), f"declaring consumer {config.durable_name}")


def message_limit(nc: Client) -> int:
    """The largest message body worth publishing: the server's limit, less room for the
    headers (a message id) that go with it."""
    return max(nc.max_payload - 4096, 1024)


async def remove_namespace(js: JetStreamContext, names: Names) -> None:
    """Deletes every stream and bucket of a namespace (for test and benchmark runs)."""
    for stream in (names.gen_stream, names.tokens_stream, names.exhausted_work_stream):
        with suppress(Exception):
            await js.delete_stream(stream)
    for bucket in names.buckets:
        with suppress(Exception):
            await js.delete_key_value(bucket)
    for store in (names.requests_store, names.model_files_store):
        with suppress(Exception):
            await js.delete_object_store(store)


def durable_pull_config(
    durable: str, filter_subject: str, max_deliver: int, max_ack_pending: int, ack_wait_s: float = ACK_WAIT_S
) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=durable,
        filter_subject=filter_subject,
        ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=ack_wait_s,
        max_deliver=max_deliver,
        max_ack_pending=max_ack_pending,
    )
