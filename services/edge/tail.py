"""Replays a response's log and tails it live, gap-free and without duplicates.

Listen to the live announcements first (asking the parsers to announce the response
to this process too, when another made it), then replay from Postgres, so nothing
committed in between is missed; live events at or below the cursor are dropped; a gap
in live sequence numbers (core NATS may drop a message) is backfilled from Postgres;
silence longer than ``poll_interval_s`` also triggers a read (backing off while NATS is
up and nothing comes), so a NATS outage only delays. A writer that must show signs of
life during silence asks for empty runs (``keepalive_s``)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

import asyncpg
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from steno.schemas.events import CommittedEvents, LoggedEvent, committed_in
from steno.schemas.ids import origin_of
from steno.services.common.followers import FollowRegistry
from steno.services.common.metrics import EDGE_REPLAY
from steno.services.common.wake_timer import WakeTimer
from steno.services.edge.event_reader import EventReader

POLL_INTERVAL_S = 2.0
# While NATS is connected and the response is silent, polling backs off to this, so
# thousands of idle tails cost Postgres little.
MAX_POLL_INTERVAL_S = 30.0
# A Postgres outage shorter than this only delays a stream.
OUTAGE_TOLERANCE_S = 30.0
_WAKE = object()

log = logging.getLogger(__name__)


class ResponseTail:
    """``origin``: this API process's tag in the ids it makes. The parser announces the
    events of those responses, and of any other this process follows (``followers``), on
    one subscription for the process, opened by ``start``."""

    def __init__(self, nc: Client, reader: EventReader, origin: str, subject: str,
                 followers: FollowRegistry) -> None:
        self._nc = nc
        self._reader = reader
        self._origin = origin
        self._subject = subject
        self._followers = followers
        self._subscription: Subscription | None = None
        # response id -> the tails following it
        self._following: dict[str, list[LiveEvents]] = {}

    async def start(self) -> None:
        self._subscription = await self._nc.subscribe(self._subject, cb=self._on_message)

    @property
    def following_origin(self) -> bool:
        """Whether the subscription to this process's responses' events is open."""
        return self._subscription is not None

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None

    async def _on_message(self, msg: Msg) -> None:
        for committed in committed_in(msg.data):
            for live in self._following.get(committed.response_id, ()):
                live.queue.put_nowait(committed)

    async def _read_after(self, response_id: str, cursor: int) -> list[LoggedEvent]:
        """Reads, retrying through a short Postgres outage; raises when it lasts too long."""
        deadline = asyncio.get_running_loop().time() + OUTAGE_TOLERANCE_S
        delay = 0.1
        while True:
            try:
                return await self._reader.read_after(response_id, cursor)
            except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError):
                if asyncio.get_running_loop().time() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _replay(self, response_id: str, cursor: int) -> list[LoggedEvent]:
        """What is stored after the cursor, when a stream starts."""
        started = time.perf_counter()
        events = await self._read_after(response_id, cursor)
        EDGE_REPLAY.observe(time.perf_counter() - started)
        return events

    async def events(
        self, response_id: str, after: int = -1, poll_interval_s: float = POLL_INTERVAL_S
    ) -> AsyncIterator[LoggedEvent]:
        """Every event with ``seq > after`` up to and including the terminal one."""
        async for run in self.runs(response_id, after, poll_interval_s):
            for event in run:
                yield event

    async def listen(self, response_id: str) -> LiveEvents:
        """Starts receiving the events the parser announces for ``response_id``; whoever
        listens before the response can produce any need not read what came before."""
        made_here = origin_of(response_id) == self._origin
        live = LiveEvents(forget=lambda: self._forget(response_id, live))
        self._following.setdefault(response_id, []).append(live)
        if not made_here:
            try:
                await self._followers.follow(response_id)
            except Exception as exc:
                log.warning("following %s live failed (%s); its stream polls Postgres", response_id, exc)
        return live

    async def _forget(self, response_id: str, live: LiveEvents) -> None:
        following = self._following.get(response_id, [])
        if live in following:
            following.remove(live)
        if not following:
            self._following.pop(response_id, None)
        if origin_of(response_id) != self._origin:
            await self._followers.unfollow(response_id)

    async def runs(
        self,
        response_id: str,
        after: int = -1,
        poll_interval_s: float = POLL_INTERVAL_S,
        *,
        live: LiveEvents | None = None,
        known: list[LoggedEvent] | None = None,
        keepalive_s: float | None = None,
    ) -> AsyncGenerator[list[LoggedEvent], None]:
        """The same events, in runs as they become available (a replay is one run), so a
        writer can send each run at once. ``known``: every event after ``after`` that is
        stored so far, when the caller has them (a response it has just created), with
        ``live`` listening since before they were stored; otherwise they are read. With
        ``keepalive_s``, an empty run after that long without one."""
        live = live or await self.listen(response_id)
        cursor = after
        interval = poll_interval_s
        poll_at = time.monotonic() + interval
        keepalive_at = time.monotonic() + keepalive_s if keepalive_s is not None else math.inf
        # The next poll and keepalive move on with every event: a mark in the queue wakes
        # the wait at the earlier one, rather than a timeout around each wait.
        wake = WakeTimer(lambda: live.queue.put_nowait(_WAKE))
        try:
            batch = known if known is not None else await self._replay(response_id, cursor)
            while True:
                run: list[LoggedEvent] = []
                for event in batch:
                    if event.seq <= cursor:
                        if event.is_terminal:
                            return  # it ended before the cursor a client gave while it ran
                        continue
                    # A gap: what was missed is in Postgres, and so is everything after it.
                    candidates = await self._read_after(response_id, cursor) if event.seq > cursor + 1 else [event]
                    for candidate in candidates:
                        run.append(candidate)
                        cursor = candidate.seq
                        if candidate.is_terminal:
                            yield run
                            return
                if run:
                    yield run
                    keepalive_at = time.monotonic() + keepalive_s if keepalive_s is not None else math.inf
                batch = []
                wake.at(min(poll_at, keepalive_at))
                received = await live.queue.get()
                if isinstance(received, CommittedEvents):
                    batch = received.events
                    if received.through_seq is not None and received.through_seq > cursor:
                        # Announced without the events (too large for a message): they are in Postgres.
                        batch = await self._read_after(response_id, cursor)
                    interval = poll_interval_s
                    poll_at = time.monotonic() + interval
                    continue
                now = time.monotonic()
                if keepalive_s is not None and now >= keepalive_at:
                    yield []
                    keepalive_at = now + keepalive_s
                if now >= poll_at:
                    batch = await self._read_after(response_id, cursor)
                    if not batch and await self._reader.ended_by(response_id, cursor):
                        return
                    connected = self._nc.is_connected
                    backing_off = connected and not batch
                    interval = min(interval * 2, MAX_POLL_INTERVAL_S) if backing_off else poll_interval_s
                    poll_at = time.monotonic() + interval
        finally:
            wake.cancel()
            await live.close()


class LiveEvents:
    """Committed events of one response as the parser announces them (core NATS: fast,
    but a message can be lost, which the tail notices as a gap)."""

    def __init__(self, forget: Callable[[], Awaitable[None]]) -> None:
        # Committed events, and the marks of a reader's wake-ups (``WakeTimer``).
        self.queue: asyncio.Queue[CommittedEvents | object] = asyncio.Queue()
        self._forget: Callable[[], Awaitable[None]] | None = forget

    async def close(self) -> None:
        if self._forget is not None:
            forget, self._forget = self._forget, None
            await forget()
