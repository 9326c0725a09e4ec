"""A response's trace context and tenant across a bus hop: what one service puts in a
message's headers, the next reads back."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from steno.services.common import logs
from steno.services.common.tracing import TENANT_HEADER, context_headers, message_headers, tenant_of, trace_context


def test_the_trace_goes_through_a_message_and_its_next_span_is_a_child() -> None:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("responses.create") as sent:
        headers = message_headers("resp_1")
    # As NATS hands headers back: a plain str -> str dict.
    received = {str(name): str(value) for name, value in headers.items()}
    with tracer.start_as_current_span("generate", context=trace_context(received)):
        pass
    create, generate = exported.get_finished_spans()
    assert headers["Nats-Msg-Id"] == "resp_1"
    assert headers["traceparent"].split("-")[1] == trace.format_trace_id(sent.get_span_context().trace_id)
    assert generate.context.trace_id == create.context.trace_id
    assert generate.parent is not None and generate.parent.span_id == create.context.span_id


def test_the_tenant_bound_for_logs_goes_along() -> None:
    with logs.response_context(tenant="a", response_id="resp_1"):
        headers = message_headers("resp_1:0:0")
    assert headers[TENANT_HEADER] == "a"
    assert tenant_of(headers) == "a"
    assert tenant_of(None) is None


def test_a_context_read_once_gives_each_message_the_same_headers() -> None:
    """A worker reads the context once per attempt and names each batch with it."""
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("generate"), logs.response_context(tenant="a", response_id="resp_1"):
        context = context_headers()
        inline = [message_headers(f"resp_1:0:{n}") for n in range(3)]
    assert [message_headers(f"resp_1:0:{n}", context) for n in range(3)] == inline
    assert set(context) == {"traceparent", TENANT_HEADER}
    assert "Nats-Msg-Id" not in context  # each message's own


def test_outside_any_trace_a_message_carries_only_its_id() -> None:
    assert message_headers("resp_1") == {"Nats-Msg-Id": "resp_1"}
    assert not trace.get_current_span(trace_context(None)).get_span_context().is_valid
    assert not trace.get_current_span(trace_context({"traceparent": "garbage"})).get_span_context().is_valid
