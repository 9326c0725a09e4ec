"""Settings, read from ``STENO_*`` environment variables (the CLI sets the same ones).

``Settings`` holds what every service reads (the bus, the database, logs and traces);
each service has its own model on top of it: ``ApiSettings``, ``WorkerSettings``,
``ParserSettings``. The README's configuration table lists every variable with its
default; ``tests/unit/common/test_config.py`` checks that it does."""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STENO_", frozen=True, extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
    database_url: str = "postgresql://postgres@127.0.0.1:5432/steno"
    # Prefix of every subject, stream, consumer and bucket, so several stacks (or test
    # runs) can share one NATS server without seeing each other's work.
    namespace: str = "steno"
    # The token stream's partitions for a new deployment; a process not set to a count
    # takes the one its deployment's stream was made for (bus.deployment_names).
    token_partitions: int = Field(default=4, ge=1)
    # JetStream replication of Steno's streams and buckets (3 on a 3-node cluster).
    stream_replicas: int = Field(default=1, ge=1)
    # NATS authentication and TLS beyond what STENO_NATS_URL carries (nats_options.py):
    # user and password, a .creds file or an nkey seed file; a CA bundle that verifies the
    # servers, and a client certificate and key for mutual TLS.
    nats_user: str | None = None
    nats_password: str | None = Field(default=None, repr=False)
    nats_creds: str | None = None
    nats_nkey_seed: str | None = None
    nats_tls_ca: str | None = None
    nats_tls_cert: str | None = None
    nats_tls_key: str | None = None
    # Logs (services/common/logs.py): text for a terminal, or one JSON object per line;
    # prompt and output text only when log_content says so.
    log_level: str = "INFO"
    log_format: Literal["text", "json"] = "text"
    log_content: bool = False
    # Where traces go (OTLP over HTTP, e.g. http://collector:4318); none are exported
    # when unset.
    otlp_endpoint: str | None = None

    @field_validator("nats_user", "nats_password", "nats_creds", "nats_nkey_seed", "nats_tls_ca", "nats_tls_cert",
                     "nats_tls_key", "otlp_endpoint", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("log_level", mode="after")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError("STENO_LOG_LEVEL is one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return level

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        # Checked where settings are made, so that a service stops at start, naming the
        # variable, rather than at its first connection; outside validation, so that a
        # NatsSettingsError reaches the caller as itself. Imported here: nats_options
        # refers back to Settings.
        from steno.services.common.nats_options import NatsOptions

        NatsOptions.from_settings(self)

    @classmethod
    def from_env(cls) -> Self:
        return cls()

    @property
    def token_partitions_chosen(self) -> bool:
        """Whether the partition count was asked for (the variable, or an argument),
        rather than left at the default."""
        return "token_partitions" in self.model_fields_set

    def with_changes(self, **changes: Any) -> Self:
        """These settings with some changed, checked again (``model_copy`` alone checks
        nothing); what was left at its default stays so (``token_partitions_chosen``)."""
        checked = type(self)(**{**self.model_dump(), **changes})
        return self.model_copy(update={name: getattr(checked, name) for name in changes})


class ApiSettings(Settings):
    """The API (and the SSE edge it hosts)."""

    # Dev mode only: every request is the "default" tenant, no API key needed.
    # STENO_AUTH=disabled sets it.
    auth_disabled: bool = Field(default=False, validation_alias=AliasChoices("auth_disabled", "STENO_AUTH"))
    # How long a request for a model with no live worker waits for one before a 404.
    model_wait_s: float = Field(default=5.0, ge=0)
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1)
    # Processes that render large or degenerate prompts away from the API's event loop,
    # and how long one render may take before it is refused.
    render_processes: int = Field(default=2, ge=1)
    render_timeout_s: float = Field(default=10.0, gt=0)
    # What one HTTP connection may hold the API with (services/api/http_limits.py): the
    # size of a request head, the time for a head to arrive, and the longest pause
    # within a request body.
    max_header_bytes: int = Field(default=16 * 1024, ge=1)
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)

    @field_validator("auth_disabled", mode="before")
    @classmethod
    def _auth_setting(cls, value: Any) -> Any:
        if isinstance(value, str):
            setting = value.strip().lower()
            if setting not in ("required", "disabled"):
                raise ValueError("STENO_AUTH is 'required' or 'disabled'")
            return setting == "disabled"
        return value


class WorkerSettings(Settings):
    """A generation worker."""

    # /metrics, /healthz and /readyz are served here when set (--metrics-port overrides).
    metrics_port: int | None = Field(default=None, ge=0, le=65535)


class ParserSettings(Settings):
    """A parser."""

    # /metrics, /healthz and /readyz are served here when set (--metrics-port overrides).
    metrics_port: int | None = Field(default=None, ge=0, le=65535)


def describe_invalid(error: ValidationError) -> list[str]:
    """One line per refused setting, naming its environment variable."""
    lines = []
    for problem in error.errors():
        field = str(problem["loc"][0]) if problem["loc"] else ""
        variable = "STENO_AUTH" if field in ("auth_disabled", "STENO_AUTH") else f"STENO_{field.upper()}"
        lines.append(f"{variable}: {problem['msg']}")
    return lines
