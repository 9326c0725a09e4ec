"""Messages held from delivery to their ack, kept from redelivery by one timer.

A JetStream consumer's ack wait is how long a dead holder's messages wait before
another holder gets them, so it is short (``ACK_WAIT_S``). A live holder keeps what it
holds by in-progress-acking every held message every ``BEAT_S``: one pass over all of
them rather than a task per message, four beats to an ack wait, so a process slowed
by a loaded machine keeps its messages while a dead one loses them within the ack wait.
A message acked within a beat of its delivery (the usual case) costs nothing more.

A holder stopped for longer than that (frozen, starved, paused by its host) may have
lost a message to another holder without knowing: ``lapsed`` says so, and such a
message is not its to ack. JetStream settles a message on an ack from any of its
deliveries, so the late holder's ack would settle the new holder's delivery too, and
were that one to die, nothing would deliver the message again. So may a message that
reaches a holder as it wakes from such a stop: delivered to its open pull request while
it was stopped, its ack wait ran while nobody read it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import suppress

from nats.aio.msg import Msg

BEAT_S = 0.3
ACK_WAIT_S = 4 * BEAT_S
# A message whose beats were this far apart may have been redelivered: the server
# counts its ack wait from the delivery, which reached the holder (and was held) a
# little later, and from each beat's arrival.
LAPSE_S = ACK_WAIT_S - BEAT_S


class _Hold:
    __slots__ = ("beaten_at", "lapsed", "msg")

    def __init__(self, msg: Msg, now: float, lapsed: bool) -> None:
        self.msg = msg
        self.beaten_at = now
        self.lapsed = lapsed


class InProgress:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._held: dict[int, _Hold] = {}  # by id(): a Msg is not hashable
        self._last_beat: float | None = None
        self._stop_seen_at: float | None = None  # the beat that came late past LAPSE_S

    def hold(self, msg: Msg) -> None:
        now = self._clock()
        # Read during a stop (before the late beat) or just after one: delivered during it.
        last_beat, stop_seen_at = self._last_beat, self._stop_seen_at
        lapsed = ((last_beat is not None and now - last_beat >= LAPSE_S)
                  or (stop_seen_at is not None and now - stop_seen_at < BEAT_S))
        self._held[id(msg)] = _Hold(msg, now, lapsed)

    def release(self, msg: Msg) -> None:
        self._held.pop(id(msg), None)

    def __len__(self) -> int:
        return len(self._held)

    def lapsed(self, msg: Msg) -> bool:
        """Whether another holder may have ``msg`` now: it went too long without a beat,
        or reached this one as it woke from a stop."""
        hold = self._held.get(id(msg))
        return hold is not None and (hold.lapsed or self._clock() - hold.beaten_at >= LAPSE_S)

    async def keep(self) -> None:
        """Beats every ``BEAT_S`` until cancelled, the first beat at once: a holder stopped
        before its first beat could not tell the stop, and would hold what reached it
        meanwhile as its own. Nothing else runs on this timer: a beat that waits for
        anything else (a round trip per held message, on a loaded bus) lets the ack wait
        run out under messages whose holder is alive, and they are handled twice."""
        while True:
            await self.beat()
            await asyncio.sleep(BEAT_S)

    async def beat(self) -> None:
        """In-progress-acks every message held now."""
        now = self._clock()
        if self._last_beat is not None and now - self._last_beat >= LAPSE_S:
            self._stop_seen_at = now
        self._last_beat = now
        for hold in list(self._held.values()):
            if now - hold.beaten_at >= LAPSE_S:
                hold.lapsed = True
            hold.beaten_at = now
            with suppress(Exception):
                await hold.msg.in_progress()
