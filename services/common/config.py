"""Settings every service reads from the environment (the CLI sets the same variables)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


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
    # Processes that render large or degenerate prompts away from the API's event loop,
    # and how long one render may take before it is refused.
    render_processes: int = 2
    render_timeout_s: float = 10.0
    # What one HTTP connection may hold the API with (services/api/http_limits.py): the
    # size of a request head, the time for a head to arrive, and the longest pause
    # within a request body.
    max_header_bytes: int = 16 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    # NATS authentication and TLS beyond what STENO_NATS_URL carries (nats_options.py):
    # user and password, a .creds file or an nkey seed file; a CA bundle that verifies the
    # servers, and a client certificate and key for mutual TLS.
    nats_user: str | None = None
    nats_password: str | None = field(default=None, repr=False)
    nats_creds: str | None = None
    nats_nkey_seed: str | None = None
    nats_tls_ca: str | None = None
    nats_tls_cert: str | None = None
    nats_tls_key: str | None = None

    def __post_init__(self) -> None:
        # Checked where settings are made, so that a service stops at start, naming the
        # variable, rather than at its first connection. Imported here: nats_options
        # refers back to Settings.
        from steno.services.common.nats_options import NatsOptions

        NatsOptions.from_settings(self)

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
            render_processes=int(os.environ.get("STENO_RENDER_PROCESSES", "2")),
            render_timeout_s=float(os.environ.get("STENO_RENDER_TIMEOUT_S", "10")),
            max_header_bytes=int(os.environ.get("STENO_MAX_HEADER_BYTES", str(16 * 1024))),
            header_timeout_s=float(os.environ.get("STENO_HEADER_TIMEOUT_S", "10")),
            body_timeout_s=float(os.environ.get("STENO_BODY_TIMEOUT_S", "30")),
            nats_user=os.environ.get("STENO_NATS_USER") or None,
            nats_password=os.environ.get("STENO_NATS_PASSWORD") or None,
            nats_creds=os.environ.get("STENO_NATS_CREDS") or None,
            nats_nkey_seed=os.environ.get("STENO_NATS_NKEY_SEED") or None,
            nats_tls_ca=os.environ.get("STENO_NATS_TLS_CA") or None,
            nats_tls_cert=os.environ.get("STENO_NATS_TLS_CERT") or None,
            nats_tls_key=os.environ.get("STENO_NATS_TLS_KEY") or None,
        )
