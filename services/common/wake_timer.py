"""A deadline for a loop that waits on a queue: at the deadline a mark is put in the
queue, so the loop's one wait (``await queue.get()``) ends for an item or for time.

A loop whose deadline moves with every item (the next flush, the next poll, the next
keepalive) would otherwise enter a timeout around each wait, which schedules a timer and
cancels it again per item. Here one timer is armed only when an earlier wake than the
armed one is needed; a wake that comes before the loop's current deadline (the deadline
moved on meanwhile) is the loop's cue to ask again, which arms the timer for the new one."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any


class WakeTimer:
    """Puts ``mark`` in ``queue`` once the earliest time asked of ``at`` comes (on
    ``time.monotonic``'s clock). ``cancel`` when the loop ends."""

    def __init__(self, queue: asyncio.Queue[Any], mark: object) -> None:
        self._queue = queue
        self._mark = mark
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at = math.inf

    def at(self, when: float | None) -> None:
        """A wake no later than ``when`` (None or infinity: none needed)."""
        if when is None or when >= self._armed_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at = when
        self._timer = self._loop.call_later(max(0.0, when - time.monotonic()), self._wake)

    def _wake(self) -> None:
        self._timer, self._armed_at = None, math.inf
        self._queue.put_nowait(self._mark)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._armed_at = None, math.inf
