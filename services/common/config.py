"""Settings every service reads from the environment (the CLI sets the same variables)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    nats_url: str
    database_url: str
    # Prefix of every subject, stream, consumer and bucket, so several stacks (or test
    # runs) can share one NATS server without seeing each other's work.
    namespace: str
    token_partitions: int
    # Dev mode only: every request is the "default" tenant, no API key needed.
    auth_disabled: bool = False
    # How long a request for a model with no live worker waits for one before a 404.
    model_wait_s: float = 5.0
    max_body_bytes: int = 32 * 1024 * 1024
    # JetStream replication of Steno's streams and buckets (3 on a 3-node cluster).
    stream_replicas: int = 1

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            nats_url=os.environ.get("STENO_NATS_URL", "nats://127.0.0.1:4222"),
            database_url=os.environ.get(
                "STENO_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/steno"
            ),
            namespace=os.environ.get("STENO_NAMESPACE", "steno"),
            token_partitions=int(os.environ.get("STENO_TOKEN_PARTITIONS", "16")),
            auth_disabled=os.environ.get("STENO_AUTH", "required").lower() == "disabled",
            model_wait_s=float(os.environ.get("STENO_MODEL_WAIT_S", "5")),
            max_body_bytes=int(os.environ.get("STENO_MAX_BODY_BYTES", str(32 * 1024 * 1024))),
            stream_replicas=int(os.environ.get("STENO_STREAM_REPLICAS", "1")),
        )
