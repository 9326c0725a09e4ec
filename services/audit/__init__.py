"""The audit of the event log: ``steno audit verify|replay|transcript`` and the
``/audit`` pages the API serves. Reads Postgres (and the bus, for a chat-template
model's files); re-parses through the parser's public interface."""

from steno.services.audit.command import add_arguments, run
from steno.services.audit.pages import router
from steno.services.audit.records import AuditRecords, StoredEvent, StoredResponse, Turn
from steno.services.audit.replay import replay
from steno.services.audit.transcript import Transcript, render
from steno.services.audit.verify import Finding, Verification, check, verify_response, verify_responses

__all__ = [
    "AuditRecords",
    "Finding",
    "StoredEvent",
    "StoredResponse",
    "Transcript",
    "Turn",
    "Verification",
    "add_arguments",
    "check",
    "render",
    "replay",
    "router",
    "run",
    "verify_response",
    "verify_responses",
]
