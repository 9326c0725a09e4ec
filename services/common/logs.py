"""Every service's log lines: readable text for a terminal (the default), or one JSON
object per line for a log pipeline (``STENO_LOG_FORMAT=json``).

A line about one response carries its ``response_id``, ``tenant``, ``attempt`` and
``model``: a service binds them where it starts handling the response
(``response_context``, or ``bind`` within a task of its own), and every line logged
there, by any module, has them; ``extra=`` adds fields to one line. Prompt and output
text stay out of the logs unless ``STENO_LOG_CONTENT=true`` (``debug_content``)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import orjson
from opentelemetry import trace

from steno.services.common.config import Settings

# The fields of the response being handled, as bound in this context.
_response_fields: ContextVar[Mapping[str, Any]] = ContextVar("steno_response_fields",
                                                             default=MappingProxyType({}))
# What a LogRecord holds of its own; any other attribute came from ``extra=``.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
_content_logged = False


@contextmanager
def response_context(**fields: Any) -> Iterator[None]:
    """Lines logged within carry ``fields`` (``response_id``, ``tenant``, ``attempt``,
    ``model``; those that are None are left out), on top of any bound outside."""
    token = _response_fields.set(_merged(fields))
    try:
        yield
    finally:
        _response_fields.reset(token)


def bind(**fields: Any) -> None:
    """Adds ``fields`` to the lines logged from here on in this context: for a task that
    handles one response, once it knows them (an asyncio task's context is its own)."""
    _response_fields.set(_merged(fields))


def bound(name: str) -> Any:
    """The value of a field bound in this context, or None."""
    return _response_fields.get().get(name)


def _merged(fields: dict[str, Any]) -> dict[str, Any]:
    return {**_response_fields.get(), **{name: value for name, value in fields.items() if value is not None}}


def debug_content(logger: logging.Logger, message: str, **content: Any) -> None:
    """A DEBUG line with prompt or output text, logged only when STENO_LOG_CONTENT allows it."""
    if _content_logged and logger.isEnabledFor(logging.DEBUG):
        logger.debug(message, extra=content)


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The line's response fields and extras, and the trace it was logged in."""
    fields = {**_response_fields.get(),
              **{name: value for name, value in vars(record).items() if name not in _RECORD_ATTRIBUTES}}
    span = trace.get_current_span().get_span_context()
    if span.is_valid:
        fields["trace_id"] = trace.format_trace_id(span.trace_id)
    return fields


class TextFormatter(logging.Formatter):
    """``<time> <service> <LEVEL> <logger>: <message>``, then the line's fields as
    ``name=value`` where it has any."""

    def __init__(self, service: str) -> None:
        super().__init__(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if not fields:
            return line
        head, newline, trace_back = line.partition("\n")
        pairs = " ".join(f"{name}={value}" for name, value in fields.items())
        return f"{head} {pairs}{newline}{trace_back}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (RFC 3339, UTC), ``level``, ``service``,
    ``logger``, ``message``, the line's fields, and ``exc_info`` as text."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="microseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "service": self._service,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(_fields(record))
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return orjson.dumps(line, default=str).decode()


def configure_logging(service: str, settings: Settings) -> None:
    """Sends every log line of the process (warnings included) to stderr, in the format
    and at the level the settings name."""
    global _content_logged
    _content_logged = settings.log_content
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service) if settings.log_format == "json" else TextFormatter(service))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(settings.log_level)
    # Neither format shows a line's caller, thread or process, and finding them was a
    # seventh of a line's cost (docs/performance.md, "The parser's seed passed on as it
    # came"): Python's logging documentation names these switches for that.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging.captureWarnings(True)
