"""NATS naming and set-up shared by every service.

Subjects (``ns`` is the deployment namespace):
  ``ns.gen.<model>``                       GenerationRequest, work-queue stream ``NS_GEN``
  ``ns.tokens.<p>.<response_id>``          TokenBatch (the last carries its GenerationEnded), stream ``NS_TOKENS``
  ``ns.events.<origin>.<response_id>``     CommittedEvents, core NATS (``origin``: the API process that made it)
KV buckets: ``ns_cancel`` (CancelOrder per response), ``ns_workers`` (WorkerRegistration per
model), ``ns_parser_leases`` and ``ns_parsers`` (token partitions' holders).
"""

from __future__ import annotations

import logging
import re
import zlib
from contextlib import suppress
from dataclasses import dataclass

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, BucketNotFoundError
from nats.js.kv import KeyValue

from steno.schemas.ids import origin_of
from steno.services.common.config import Settings

log = logging.getLogger(__name__)

# How long a consumer waits for an ack (or an in-progress heartbeat) before redelivering.
ACK_WAIT_S = 30.0
# Token messages are only needed until the parser has committed them; keep them a while
# longer so an operator can inspect a stuck response.
TOKENS_MAX_AGE_S = 24 * 3600
DUPLICATE_WINDOW_S = 120
# A cancel flag outlives any request that could still be waiting in the queue.
CANCEL_FLAG_TTL_S = 24 * 3600
# Workers refresh their model's registration this often; it lapses after the TTL.
WORKER_REGISTRATION_EVERY_S = 3.0
WORKER_REGISTRATION_TTL_S = 10.0


def model_token(model: str) -> str:
    """A model name made safe for one NATS subject token."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", model)


def partition_of(response_id: str, partitions: int) -> int:
    return zlib.crc32(response_id.encode()) % partitions


@dataclass(frozen=True)
class Names:
    namespace: str
    token_partitions: int
    replicas: int = 1

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

    def tokens_subject(self, response_id: str) -> str:
        return f"{self.namespace}.tokens.{partition_of(response_id, self.token_partitions)}.{response_id}"

    def tokens_partition_filter(self, partition: int) -> str:
        return f"{self.namespace}.tokens.{partition}.>"

    def parser_consumer(self, partition: int) -> str:
        return f"parser-p{partition}"

    def events_subject(self, response_id: str) -> str:
        """Committed events of one response, under its origin (the API process that made it)."""
        return f"{self.namespace}.events.{origin_of(response_id)}.{response_id}"

    def origin_events(self, origin: str) -> str:
        """Committed events of every response made by one API process."""
        return f"{self.namespace}.events.{origin}.*"

    @property
    def cancel_bucket(self) -> str:
        return f"{self.namespace}_cancel"

    @property
    def workers_bucket(self) -> str:
        return f"{self.namespace}_workers"

    @property
    def parser_leases_bucket(self) -> str:
        return f"{self.namespace}_parser_leases"

    @property
    def parsers_bucket(self) -> str:
        return f"{self.namespace}_parsers"

    @classmethod
    def from_settings(cls, settings: Settings) -> Names:
        return cls(settings.namespace, settings.token_partitions, settings.stream_replicas)


async def connect(url: str, name: str) -> Client:
    async def on_error(exc: Exception) -> None:
        log.warning("nats: %s", exc)

    return await nats.connect(
        # Several servers (a cluster) may be given, comma-separated.
        [server.strip() for server in url.split(",") if server.strip()],
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        error_cb=on_error,
    )


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.add_stream(config)
    except BadRequestError:
        # Exists with other settings: bring it to ours.
        await js.update_stream(config)


async def ensure_streams(js: JetStreamContext, names: Names) -> None:
    """Declares the streams idempotently; every service calls this at start."""
    await _ensure_stream(
        js,
        StreamConfig(
            name=names.gen_stream,
            subjects=[f"{names.namespace}.gen.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            duplicate_window=DUPLICATE_WINDOW_S,
            num_replicas=names.replicas,
        ),
    )
    await _ensure_stream(
        js,
        StreamConfig(
            name=names.tokens_stream,
            subjects=[f"{names.namespace}.tokens.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=TOKENS_MAX_AGE_S,
            duplicate_window=DUPLICATE_WINDOW_S,
            num_replicas=names.replicas,
        ),
    )


async def kv_bucket(js: JetStreamContext, name: str, ttl_s: float, replicas: int = 1) -> KeyValue:
    """Opens a KV bucket, creating it on first use."""
    try:
        return await js.key_value(name)
    except BucketNotFoundError:
        return await js.create_key_value(KeyValueConfig(bucket=name, ttl=ttl_s, history=1, replicas=replicas))


async def cancel_flags(js: JetStreamContext, names: Names) -> KeyValue:
    """Responses whose cancellation was asked for (key: response id)."""
    return await kv_bucket(js, names.cancel_bucket, CANCEL_FLAG_TTL_S, names.replicas)


async def worker_registry(js: JetStreamContext, names: Names) -> KeyValue:
    """Models some live worker serves (key: model token), refreshed by the workers."""
    return await kv_bucket(js, names.workers_bucket, WORKER_REGISTRATION_TTL_S, names.replicas)


async def remove_namespace(js: JetStreamContext, names: Names) -> None:
    """Deletes every stream and bucket of a namespace (for test and benchmark runs)."""
    for stream in (names.gen_stream, names.tokens_stream):
        with suppress(Exception):
            await js.delete_stream(stream)
    for bucket in (names.cancel_bucket, names.workers_bucket, names.parser_leases_bucket, names.parsers_bucket):
        with suppress(Exception):
            await js.delete_key_value(bucket)


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
