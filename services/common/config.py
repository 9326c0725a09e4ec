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

    @classmethod
    def from_env(cls) -> "Settings":
        return cls(
            nats_url=os.environ.get("STENO_NATS_URL", "nats://127.0.0.1:4222"),
            database_url=os.environ.get(
                "STENO_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/steno"
            ),
            namespace=os.environ.get("STENO_NAMESPACE", "steno"),
            token_partitions=int(os.environ.get("STENO_TOKEN_PARTITIONS", "16")),
        )
