"""What one connection may make the API hold: uvicorn's httptools protocol with a limit
on the size of a request head and timeouts on a head and on a body that stop arriving.

uvicorn has no setting for any of these with httptools (``h11_max_incomplete_event_size``
is h11's, answers 400, and h11 parses in Python), and closes only idle keep-alive
connections: a client that sends part of a request and stops held its connection, and
whatever it had sent, for ever. This subclass keeps uvicorn's parsing and request
handling and adds one timer per connection, armed lazily: a request moves a deadline
(an attribute write), and the timer, when it fires, re-arms itself for the deadline if
that has moved, so the usual request costs no timer operation.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from steno.services.api.errors import error_body

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HttpLimits:
    # Request line and headers together.
    max_head_bytes: int = 16 * 1024
    # From a new connection's start, or from a request's first byte on a kept-alive one
    # (the idle time before that is uvicorn's ``timeout_keep_alive``).
    head_timeout_s: float = 10.0
    # Without a byte of the body while the server is reading it.
    body_timeout_s: float = 30.0


# Where the connection is in its current request. Plain ints: they are compared on
# every read.
_CONNECTED = 0  # nothing received yet
_HEAD = 1  # a request head has begun
_BODY = 2  # the head is complete, the body (possibly empty) is not
_BETWEEN = 3  # the last request is complete; the next has not begun
_LINGER = 4  # an error has been answered; reading and dropping what the client still sends


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    limits: ClassVar[HttpLimits] = HttpLimits()

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._phase = _CONNECTED
        self._head_bytes = 0
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # A client that connects and sends nothing would otherwise hold the connection
        # for ever: uvicorn arms its keep-alive timer only after a response.
        self._set_deadline(self.limits.head_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._phase = _LINGER
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        phase = self._phase
        if phase == _BODY:
            # Any byte of the body is progress.
            self._deadline = self.loop.time() + self.limits.body_timeout_s
        elif phase == _LINGER:
            return
        limit = self.limits.max_head_bytes
        if len(data) > (limit - self._head_bytes if phase <= _HEAD else limit):
            self._feed_in_pieces(data)
            return
        if phase <= _HEAD:
            self._head_bytes += len(data)
        super().data_received(data)

    def _feed_in_pieces(self, data: bytes) -> None:
        """Feeds a read that could hold more than the limit of a head in pieces of the
        limit. The parser buffers a header until it is complete, so a head must be cut
        off at the limit rather than measured after the fact; a head that starts inside
        a piece that began with another request's body is counted from the next piece,
        so no more than about twice the limit is ever buffered."""
        limit = self.limits.max_head_bytes
        while data:
            in_head = self._phase <= _HEAD
            room = limit - self._head_bytes if in_head else limit
            if room <= 0:
                self._reject(431, f"The request line and headers exceed {limit} bytes.")
                return
            if in_head:
                self._head_bytes += min(room, len(data))
            super().data_received(data[:room])
            data = data[room:]
            if self._phase == _LINGER or self.transport.is_closing() or self.transport.get_protocol() is not self:
                return

    def on_message_begin(self) -> None:
        if self._phase != _CONNECTED:
            # The first byte of a later request on the connection (a new connection's
            # deadline runs from its start).
            self._head_bytes = 0
            self._set_deadline(self.limits.head_timeout_s)
        self._phase = _HEAD
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        self._set_deadline(self.limits.body_timeout_s)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase = _BETWEEN
        super().on_message_complete()

    def _set_deadline(self, delay_s: float) -> None:
        deadline = self.loop.time() + delay_s
        self._deadline = deadline
        if self._timer is None or self._timer_at > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._arm(deadline)

    def _arm(self, at: float) -> None:
        self._timer_at = at
        self._timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        phase = self._phase
        if phase == _LINGER:
            self.transport.close()
            return
        if phase == _BETWEEN or self.transport.is_closing() or self.transport.get_protocol() is not self:
            return
        if self.loop.time() < self._deadline:
            self._arm(self._deadline)
            return
        if phase == _CONNECTED:
            self._close()
        elif phase == _HEAD:
            self._reject(408, "The request headers were not received in time.")
        elif self.flow.read_paused or self.cycle.waiting_for_100_continue:
            # The server is holding the body back (the app is not reading it yet), not
            # the client.
            self._set_deadline(self.limits.body_timeout_s)
        else:
            self._reject(408, "The request body was not received in time.")

    def _reject(self, status: int, message: str) -> None:
        """Answers ``status`` if the connection is between responses, else just closes it
        (an answer now would land inside another response)."""
        cycle = self.cycle
        # In a body, the cycle is this request's (queued behind a running one if
        # pipelined); in a head, the previous request's.
        if self._phase == _BODY:
            free = not cycle.response_started and not self.pipeline
        else:
            free = cycle is None or cycle.response_complete
        if not free:
            self._close()
            return
        log.info("%s from %s: %s", status, self.client, message)
        body = orjson.dumps(error_body(status, message))
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend([b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(),
                        b"\r\nconnection: close\r\n\r\n", body])
        self.transport.write(b"".join(content))
        self._stop_cycle()
        # Closing with unread bytes makes the kernel reset the connection, and a client
        # still sending (a large head) would see the reset instead of the answer: end
        # the sending side, drop what still comes, and close when the client does or
        # after a head timeout.
        self._phase = _LINGER
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()
        if self._timer is not None:
            self._timer.cancel()
        self._arm(self.loop.time() + self.limits.head_timeout_s)

    def _close(self) -> None:
        self._stop_cycle()
        self._phase = _LINGER
        self.transport.close()

    def _stop_cycle(self) -> None:
        # The app must not write after the answer, nor wait for a body that will not come.
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()


def limited_protocol(limits: HttpLimits) -> type[asyncio.Protocol]:
    """The protocol class to give uvicorn (``http=``): it makes one per connection with
    no arguments of ours, so the limits travel on the class."""

    class Configured(LimitedHttpToolsProtocol):
        pass

    Configured.limits = limits
    return Configured
