"""The parser's public interface beyond its service: what re-parsing a stored response
needs (``steno.services.audit``), so that nothing reaches into its modules."""

from steno.services.parser.event_log import EventLog, ResponseRecord, ResponseWrite
from steno.services.parser.reparse import Reparse, reparse

__all__ = ["EventLog", "Reparse", "ResponseRecord", "ResponseWrite", "reparse"]
