"""One standing pull request on a durable consumer, so messages arrive as they are
stored instead of one fetch round trip (and an expiry notice) per wake-up.

nats-py's ``fetch`` sends a new request each call; while a partition sees a message every
few milliseconds, those requests and their 408 replies outnumbered the token messages
themselves (``steno bench``). Here one request for ``batch`` messages stays open for
``expires_s``; a new one goes out when it is used up, expires, or the server ends it.
A request that a departed holder left open ends within ``expires_s``, so a partition
changes hands as quickly as with short fetches."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

log = logging.getLogger(__name__)

STATUS = "Status"
# Idle heartbeat of a request that found nothing yet; the server's end-of-request notices.
HEARTBEAT, NO_MESSAGES, REQUEST_ENDED, CONFLICT = "100", "404", "408", "409"
# How long past its expiry a request's end notice may be late before we stop waiting.
GRACE_S = 0.5


class ContinuousPull:
    def __init__(self, nc: Client, stream: str, durable: str, batch: int = 256, expires_s: float = 1.0) -> None:
        self._nc = nc
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._batch = batch
        self._expires_s = expires_s
        self._subscription: Subscription | None = None
        self._inbox = ""
        self._left = 0  # messages the open request may still deliver
        self._ends_at = 0.0

    async def start(self) -> None:
        self._inbox = self._nc.new_inbox()
        self._arrived: asyncio.Queue[Msg] = asyncio.Queue()
        self._subscription = await self._nc.subscribe(self._inbox, cb=self._on_message)
        await self._request()

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None

    async def _on_message(self, msg: Msg) -> None:
        self._arrived.put_nowait(msg)

    async def _request(self) -> None:
        body = {"batch": self._batch, "expires": int(self._expires_s * 1e9)}
        await self._nc.publish(self._next_subject, json.dumps(body).encode(), reply=self._inbox)
        self._left = self._batch
        self._ends_at = time.monotonic() + self._expires_s + GRACE_S

    async def next_messages(self, limit: int) -> list[Msg]:
        """Waits for the next message, then takes whatever else has arrived, up to ``limit``."""
        taken: list[Msg] = []
        while not taken:
            timeout = max(0.0, self._ends_at - time.monotonic())
            try:
                msg = await asyncio.wait_for(self._arrived.get(), timeout)
            except asyncio.TimeoutError:
                await self._request()  # its end notice was lost (a NATS restart, say)
                continue
            await self._take(msg, taken)
            while len(taken) < limit and not self._arrived.empty():
                await self._take(self._arrived.get_nowait(), taken)
        return taken

    async def _take(self, msg: Msg, taken: list[Msg]) -> None:
        status = msg.headers.get(STATUS) if msg.headers else None
        if status is None:
            taken.append(msg)
            self._left -= 1
            if self._left == 0:
                await self._request()
        elif status == HEARTBEAT:
            return
        elif status in (NO_MESSAGES, REQUEST_ENDED):
            await self._request()
        else:
            if status == CONFLICT:  # leadership change, consumer deleted or changed
                log.info("pull request on %s ended: %s %s", self._next_subject, status, msg.headers.get("Description"))
            else:
                log.warning("pull request on %s failed: %s %s", self._next_subject, status,
                            msg.headers.get("Description"))
            await asyncio.sleep(0.1)
            await self._request()
