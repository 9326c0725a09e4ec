"""A deadline that moves with every item a loop handles (the next flush, the next poll,
the next keepalive), kept on one timer.

A loop whose deadline moves with every item would otherwise enter a timeout around each
wait, or cancel and schedule a timer per item. Here one timer is armed only when an
earlier wake than the armed one is needed; a wake that comes before the loop's current
deadline (the deadline moved on meanwhile) is the loop's cue to look again, which arms
the timer for the new one. A loop that waits on a queue is woken by a mark put in it."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable


class WakeTimer:
    """Calls ``wake`` once the earliest time asked of ``at`` comes (on
    ``time.monotonic``'s clock). ``cancel`` when the loop ends."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake_up = wake
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
        self._wake_up()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._armed_at = None, math.inf
