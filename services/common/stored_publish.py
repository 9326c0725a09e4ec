"""Publishing to JetStream, each message's PubAck awaited, for less than nats-py's
``JetStreamContext.publish`` spends: every message there takes a fresh random reply
token, a ``wait_for`` and the PubAck decoded as JSON into an object, where the
publishers here only need to know that the message is stored."""

from __future__ import annotations

import asyncio
import itertools

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError, NoStreamResponseError

# nats-py's own default for a JetStream publish.
PUBACK_TIMEOUT_S = 5.0
_NO_RESPONDERS = "503"


class StoredPublisher:
    """One reply subscription for the process; each message's reply subject ends in a
    number of its own. Call ``start`` once connected."""

    def __init__(self, nc: Client, timeout_s: float = PUBACK_TIMEOUT_S) -> None:
        self._nc = nc
        self._timeout_s = timeout_s
        self._prefix = ""
        self._numbers = itertools.count()
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._subscription: Subscription | None = None

    async def start(self) -> None:
        inbox = self._nc.new_inbox()
        self._prefix = inbox + "."
        self._subscription = await self._nc.subscribe(inbox + ".*", cb=self._on_reply)

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None

    async def publish(self, subject: str, body: bytes, headers: dict[str, str]) -> None:
        """Returns once JetStream has stored the message (or found it a duplicate of one
        stored under the same ``Nats-Msg-Id``); raises as ``JetStreamContext.publish``
        does when it has not: ``NoStreamResponseError``, ``APIError``, ``TimeoutError``."""
        assert self._subscription is not None, "start() first"
        token = str(next(self._numbers))
        reply: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._waiting[token] = reply
        try:
            await self._nc.publish(subject, body, reply=self._prefix + token, headers=headers)
            try:
                async with asyncio.timeout(self._timeout_s):
                    ack = await reply
            except TimeoutError:
                raise NatsTimeoutError from None
        finally:
            self._waiting.pop(token, None)
        if ack.headers is not None and ack.headers.get("Status") == _NO_RESPONDERS:
            raise NoStreamResponseError
        if b'"error"' in ack.data and "error" in (decoded := orjson.loads(ack.data)):
            raise APIError.from_error(decoded["error"])

    async def _on_reply(self, msg: Msg) -> None:
        reply = self._waiting.get(msg.subject[len(self._prefix):])
        if reply is not None and not reply.done():
            reply.set_result(msg)
