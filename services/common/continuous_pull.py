"""One standing pull request on a durable consumer, so messages arrive as they are
stored instead of one fetch round trip (and an expiry notice) per wake-up.

nats-py's ``fetch`` sends a new request each call; while a partition sees a message every
few milliseconds, those requests and their 408 replies outnumbered the token messages
themselves (docs/performance.md). Here one request for ``batch`` messages stays open for
``expires_s``; a new one goes out when it is used up, when it nears its expiry, or when
the server ends it. JetStream drops a request whose inbox lost its subscriber (a holder
that stopped or died) when it next has a message for it, so a partition changes hands
at once.

The next request does not wait for the open one's end notice: it can come late or not at
all, and waiting for it left the consumer without a request for as long as we gave the
notice to come (docs/performance.md, "A stopped holder's pull requests"). A request
without credits is renewed halfway through its life, so the two overlap and a busy
reader late to renew leaves no gap; one with credits as it expires, since two open at
once could take twice the credits. Each request has a reply subject of its own, so an
end notice of one already replaced is told apart and ignored; a request NATS lost (a
reconnect) is renewed when noticed.

With ``credits`` the consumer takes no more messages than it can run at once (a
worker's free slots): each message delivered uses a credit, ``release`` gives one back,
and a request asks for at most the credits in hand, so waiting work stays in JetStream.
Several pulls may share one ``Credits``: each asks for what is free when it asks, so
together they may take up to their open requests' sizes beyond it (a worker's affinity
shards pull one message at a time for this reason).
A request is never left waiting for a full batch: messages are handed over as they come.

With ``held`` every message is held there from its arrival (kept from redelivery by
in-progress acks) until its taker releases it, having acked it, and each request lives
``HELD_EXPIRES_S``, no longer than a held message takes to lapse: a holder stopped
(frozen, paused by its host) has no request open by the time anything it took is
delivered again, so a message loses one delivery to it (two where its last beat before
the stop came late). A request that lived longer took redeliveries in turn with the
live holders' requests, each lapsing unread, until a message ran out of deliveries.

Pulls that share one ``Arrivals`` are read together: one wait for whatever any of them
delivered, so a reader of many consumers (a parser's partitions, each given a message
per engine step) wakes once per burst rather than once per message."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import suppress

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from steno.services.common.in_progress import LAPSE_S, InProgress

log = logging.getLogger(__name__)

STATUS = "Status"
# Idle heartbeat of a request that found nothing yet; the server's end-of-request notices.
HEARTBEAT, NO_MESSAGES, REQUEST_ENDED, CONFLICT = "100", "404", "408", "409"
# How long a request lives: long, since renewing costs a request and its end notice, but
# shorter than a held message's lapse where messages are held (the module's docstring).
EXPIRES_S = 30.0
HELD_EXPIRES_S = LAPSE_S
# How often a waiting reader checks that its request is still there.
CHECK_EVERY_S = 1.0
# JetStream's reply subjects without a domain: $JS.ACK.<stream>.<consumer>.<delivered>...
_V1_REPLY_TOKENS = 9


def deliveries(msg: Msg) -> int:
    """``msg.metadata.num_delivered``, read from its reply subject alone: the parser asks
    it of every message, and this costs several times less than the whole metadata
    (docs/performance.md, "The parser's last delivery")."""
    tokens = (msg.reply or "").split(".")
    return int(tokens[4] if len(tokens) == _V1_REPLY_TOKENS else tokens[Msg.Ack.NumDelivered])


class Credits:
    """Messages one or more pulls may take before some are released."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._returned = asyncio.Event()

    def use(self) -> None:
        self.count -= 1

    def release(self, count: int = 1) -> None:
        self.count += count
        self._returned.set()

    async def returned(self) -> None:
        """Waits until some credit is released."""
        self._returned.clear()
        await self._returned.wait()


class ContinuousPull:
    def __init__(self, nc: Client, stream: str, durable: str, batch: int = 256, expires_s: float | None = None,
                 credits: Credits | None = None, held: InProgress | None = None,
                 arrivals: Arrivals | None = None) -> None:
        self._nc = nc
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._batch = batch
        if expires_s is None:
            expires_s = EXPIRES_S if held is None else HELD_EXPIRES_S
        self._expires_s = expires_s
        self._subscription: Subscription | None = None
        self._inbox = ""
        self._requests_sent = 0
        self._reply = ""  # the open request's reply subject
        self._left = 0  # messages the newest request may still deliver; 0: none is open
        # When the open request is replaced: halfway through its life, or at its end.
        self._renew_at = 0.0
        self._renew_after_s = self._expires_s if credits is not None else self._expires_s / 2
        self._reconnects = 0  # the connection's reconnect count when the request went out
        self._credits = credits
        self._held = held
        self._arrivals = arrivals if arrivals is not None else Arrivals()

    async def start(self) -> None:
        self._inbox = self._nc.new_inbox()
        self._subscription = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_message)
        self._arrivals.pulls.add(self)
        await self._request()

    @property
    def receiving(self) -> bool:
        return self._subscription is not None

    async def stop(self) -> None:
        """Stops receiving; what arrived but was not taken goes back to the stream at once."""
        self._arrivals.pulls.discard(self)
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None
        await self._arrivals.hand_back(self)

    async def _on_message(self, msg: Msg) -> None:
        if self._held is not None and not (msg.headers and msg.headers.get(STATUS)):
            self._held.hold(msg)
        self._arrivals.queue.put_nowait((self, msg))

    async def _request(self) -> None:
        size = self._batch if self._credits is None else min(self._batch, self._credits.count)
        self._left = max(size, 0)
        if self._left == 0:
            return
        body = {"batch": size, "expires": int(self._expires_s * 1e9)}
        self._reconnects = self._nc.stats["reconnects"]
        self._requests_sent += 1
        self._reply = f"{self._inbox}.{self._requests_sent}"
        await self._nc.publish(self._next_subject, json.dumps(body).encode(), reply=self._reply)
        self._renew_at = time.monotonic() + self._renew_after_s

    async def next_messages(self, limit: int) -> list[Msg]:
        """Waits for the next message, then takes whatever else has arrived, up to ``limit``."""
        return [msg for _, msg in await self._arrivals.next_messages(limit)]

    async def _renewed(self) -> float:
        """Sends a new request where the open one is used up, due for renewal, or lost
        (waiting for a credit first where there is none); returns the seconds until the
        request must be checked again."""
        while self._left == 0:
            await self._request()
            if self._left == 0 and self._credits is not None:  # no credit: wait for some to come back
                await self._credits.returned()
        if time.monotonic() >= self._renew_at or self._nc.stats["reconnects"] != self._reconnects:
            await self._request()
        return min(CHECK_EVERY_S, self._renew_at - time.monotonic())

    async def _take(self, msg: Msg, taken: list[tuple[ContinuousPull, Msg]]) -> None:
        status = msg.headers.get(STATUS) if msg.headers else None
        if not self.receiving:  # stopped while this waited to be read
            if status is None:
                await self._hand_back(msg)
            return
        if status is None:
            taken.append((self, msg))
            self._left -= 1
            if self._credits is not None:
                self._credits.use()
            if self._left <= 0:  # or fewer: a request being replaced may deliver a few more as it ends
                await self._request()
        elif status == HEARTBEAT or msg.subject != self._reply:  # the end of a request already replaced
            return
        elif status in (NO_MESSAGES, REQUEST_ENDED):
            await self._request()
        else:
            description = (msg.headers or {}).get("Description")
            if status == CONFLICT:  # leadership change, consumer deleted or changed
                log.info("pull request on %s ended: %s %s", self._next_subject, status, description)
            else:
                log.warning("pull request on %s failed: %s %s", self._next_subject, status, description)
            await asyncio.sleep(0.1)
            await self._request()

    async def _hand_back(self, msg: Msg) -> None:
        with suppress(Exception):
            await msg.nak()
        if self._held is not None:
            self._held.release(msg)


class Arrivals:
    """What one or more pulls delivered, in the order it came, read in one place. A pull
    out of credits waits for one before the others are read, so pulls read together take
    none (the parser's partitions); a pull with credits reads alone (a worker's slots)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[ContinuousPull, Msg]] = asyncio.Queue()
        self.pulls: set[ContinuousPull] = set()

    async def next_messages(self, limit: int, within_s: float | None = None) -> list[tuple[ContinuousPull, Msg]]:
        """Waits for the next message on any started pull, then takes whatever else has
        arrived, up to ``limit``; each message with the pull it came by. With
        ``within_s``, none if nothing arrives within that many seconds."""
        taken: list[tuple[ContinuousPull, Msg]] = []
        give_up_at = None if within_s is None else time.monotonic() + within_s
        while not taken:
            wait_s = CHECK_EVERY_S
            for pull in list(self.pulls):
                wait_s = min(wait_s, await pull._renewed())
            if give_up_at is not None:
                if time.monotonic() >= give_up_at:
                    return taken
                wait_s = min(wait_s, give_up_at - time.monotonic())
            try:
                pull, msg = await asyncio.wait_for(self.queue.get(), wait_s)
            except TimeoutError:
                continue
            await pull._take(msg, taken)
            while len(taken) < limit and not self.queue.empty():
                pull, msg = self.queue.get_nowait()
                await pull._take(msg, taken)
        return taken

    async def hand_back(self, stopped: ContinuousPull) -> None:
        """Sends back at once what a stopped pull delivered and nobody took."""
        kept: list[tuple[ContinuousPull, Msg]] = []
        while not self.queue.empty():
            pull, msg = self.queue.get_nowait()
            if pull is not stopped:
                kept.append((pull, msg))
            elif not (msg.headers and msg.headers.get(STATUS)):
                await pull._hand_back(msg)
        for item in kept:
            self.queue.put_nowait(item)
