"""Traces across Steno's processes, with OpenTelemetry.

A response's trace starts at the API (FastAPI's span for the request, within it
``responses.create``, and ``responses.stream`` for its SSE body) and travels with its bus
messages: the W3C ``traceparent``/``tracestate`` headers go beside ``Nats-Msg-Id`` on
the generation request and on every token batch, so the worker's ``generate`` span and
the parser's spans join it. The same headers carry the response's tenant, for the log
lines of the services that read them (``services/common/logs.py``).

Spans are exported (OTLP over HTTP) only where ``STENO_OTLP_ENDPOINT`` is set; elsewhere
``tracer`` is OpenTelemetry's no-op tracer, which costs next to nothing."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from steno.services.common import logs
from steno.services.common.config import Settings

# Delegates to the provider configure_tracing sets, if any.
tracer = trace.get_tracer("steno")
TENANT_HEADER = "Steno-Tenant"
TRACEPARENT = "traceparent"
_propagator = TraceContextTextMapPropagator()
Chunk = TypeVar("Chunk")
_exporting = False


def configure_tracing(service: str, settings: Settings) -> None:
    """Exports this process's spans as ``steno-<service>`` to the OTLP endpoint, if one is set."""
    if settings.otlp_endpoint is None:
        return
    # Imported only here: a process that exports no traces needs none of the SDK.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: f"steno-{service}"}))
    exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint.rstrip("/") + "/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    global _exporting
    _exporting = True


def exporting() -> bool:
    """Whether this process's spans go anywhere: a span made only to be dropped can be
    skipped on a hot path (the trace context still travels in the headers)."""
    return _exporting


def context_headers() -> dict[str, str]:
    """What every bus message about the response handled here carries beside its id:
    the current trace context and the bound tenant."""
    headers: dict[str, str] = {}
    _propagator.inject(headers)
    tenant = logs.bound("tenant")
    if tenant is not None:
        headers[TENANT_HEADER] = tenant
    return headers


def message_headers(msg_id: str, context: Mapping[str, str] | None = None) -> dict[str, str]:
    """The headers of a bus message about the response handled here: its id (for
    JetStream's deduplication) and ``context_headers()``, or ``context``, what an earlier
    call of it gave in the same context (a loop that publishes a message per token batch
    reads the context once)."""
    return {"Nats-Msg-Id": msg_id, **(context_headers() if context is None else context)}


def trace_context(headers: Mapping[str, str] | None) -> Context:
    """The trace context a received message carries (an empty one if it carries none)."""
    return _propagator.extract(headers or {})


def tenant_of(headers: Mapping[str, str] | None) -> str | None:
    """The tenant a received message names, for log lines about its response."""
    return (headers or {}).get(TENANT_HEADER)


def traced_stream(chunks: AsyncGenerator[Chunk, None], name: str, parent: Context,
                  attributes: Mapping[str, str]) -> AsyncGenerator[Chunk, None]:
    """``chunks`` as they come, within a span from the first to the last (or to the
    client leaving): a response body sent after the request's own span has ended.
    Where no span is exported, ``chunks`` itself: a layer less for every chunk sent."""
    if not _exporting:
        return chunks
    return _spanned(chunks, name, parent, attributes)


async def _spanned(chunks: AsyncGenerator[Chunk, None], name: str, parent: Context,
                   attributes: Mapping[str, str]) -> AsyncGenerator[Chunk, None]:
    span = tracer.start_span(name, context=parent, attributes=attributes)
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        span.end()
        await chunks.aclose()
