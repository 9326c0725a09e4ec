"""The ``openai`` SDK's own stream event union, as a test oracle."""

from __future__ import annotations

import orjson
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

stream_event = TypeAdapter(ResponseStreamEvent)


def validate_events(payloads: list[str]) -> list:
    """Parses every payload as the SDK would; raises on any that does not conform."""
    return [stream_event.validate_python(orjson.loads(p)) for p in payloads]


def validate_response(snapshot: dict) -> Response:
    return Response.model_validate(snapshot)
