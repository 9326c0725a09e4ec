"""One trace per response across the processes: a stack that exports its spans (OTLP
over HTTP) to a collector started here, which keeps them in memory."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from steno.infra.processes import Stack
from tests.conftest import separate_stack

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"
WAIT_S = 30.0


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    attributes: dict[str, Any]


@dataclass
class Collector:
    """What an OTLP/HTTP trace endpoint received."""

    url: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                with self.lock:
                    self.spans += [ReceivedSpan(resource["service.name"], span.name, span.trace_id.hex(),
                                                span.span_id.hex(), span.parent_span_id.hex() or None,
                                                _attributes(span.attributes))
                                   for span in scope_spans.spans]


def _attributes(attributes: Any) -> dict[str, Any]:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in attributes}


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    received = Collector(f"http://127.0.0.1:{server.server_address[1]}")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path == "/v1/traces":
                received.take(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server.RequestHandlerClass = Handler
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield received
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def traced_stack(settings, collector: Collector, tmp_path, monkeypatch) -> Iterator[Stack]:
    # Spans leave each process a moment after they end, not in the exporter's usual batches.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    traced = settings.with_changes(otlp_endpoint=collector.url, model_wait_s=10.0)
    with separate_stack(traced, "traces", tmp_path) as stack:
        stack.add("parser", "parser")
        stack.add("worker", "worker", "--sim-tokens-per-s", "0")
        stack.add_api()
        yield stack


def trace_of(collector: Collector, response_id: str, names: set[str]) -> list[ReceivedSpan]:
    """The spans of the trace the API started for the response, once those named have come."""
    deadline = time.monotonic() + WAIT_S
    while True:
        spans = collector.received()
        created = [s for s in spans if s.name == "responses.create" and s.attributes.get("steno.response_id")
                   == response_id]
        if created:
            in_trace = [s for s in spans if s.trace_id == created[0].trace_id]
            if names <= {s.name for s in in_trace}:
                return in_trace
        assert time.monotonic() < deadline, f"spans of {response_id} missing: {sorted(names)}; received {spans}"
        time.sleep(0.2)


def test_each_response_is_one_trace_from_the_api_through_worker_and_parser(traced_stack: Stack,
                                                                            collector: Collector) -> None:
    sdk = openai.OpenAI(base_url=traced_stack.base_url, api_key=traced_stack.keys["a"], max_retries=0, timeout=60)
    with sdk.responses.create(model=MODEL, input="Name a colour.", stream=True) as events:
        streamed = [event.response.id for event in events if event.type == "response.completed"]
    blocking = sdk.responses.create(model=MODEL, input="Name a fruit.")
    assert len(streamed) == 1 and blocking.status == "completed"

    traces = {
        streamed[0]: trace_of(collector, streamed[0], {"responses.create", "responses.stream", "generate", "parse"}),
        blocking.id: trace_of(collector, blocking.id, {"responses.create", "generate", "parse"}),
    }
    assert len({spans[0].trace_id for spans in traces.values()}) == 2
    for response_id, spans in traces.items():
        by_name: dict[str, list[ReceivedSpan]] = {}
        for span in spans:
            by_name.setdefault(span.name, []).append(span)
        [create], [generate] = by_name["responses.create"], by_name["generate"]
        assert {s.service for s in spans} == {"steno-api", "steno-worker", "steno-parser"}
        # One chain: the API's request span is the root, and every other span's parent is in the trace.
        [root] = [s for s in spans if s.parent_id is None]
        assert root.service == "steno-api" and create.parent_id == root.span_id, spans
        assert {s.parent_id for s in spans if s is not root} <= {s.span_id for s in spans}, spans
        assert create.service == "steno-api"
        assert create.attributes == {"steno.response_id": response_id, "steno.model": MODEL, "steno.tenant": "a",
                                     "steno.stream": response_id in streamed}
        assert (generate.service, generate.parent_id) == ("steno-worker", create.span_id)
        assert generate.attributes["steno.response_id"] == response_id
        for parse in by_name["parse"]:
            assert (parse.service, parse.parent_id) == ("steno-parser", generate.span_id)
            assert parse.attributes["steno.response_id"] == response_id
        for stream in by_name.get("responses.stream", []):
            assert (stream.service, stream.parent_id) == ("steno-api", create.span_id)
    assert "responses.stream" not in {s.name for s in traces[blocking.id]}
