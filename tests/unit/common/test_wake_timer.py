"""A loop's deadline (here a mark in its queue): one timer, armed only for an earlier wake."""

import asyncio
import time

from steno.services.common.wake_timer import WakeTimer

MARK = object()


async def marks_within(queue: asyncio.Queue, seconds: float) -> list[float]:
    """When each mark came (seconds from now) over ``seconds``."""
    started = time.monotonic()
    came = []
    while (left := seconds - (time.monotonic() - started)) > 0:
        try:
            item = await asyncio.wait_for(queue.get(), left)
        except TimeoutError:
            break
        assert item is MARK
        came.append(time.monotonic() - started)
    return came


async def test_the_mark_comes_at_the_deadline():
    queue: asyncio.Queue = asyncio.Queue()
    wake = WakeTimer(lambda: queue.put_nowait(MARK))
    wake.at(time.monotonic() + 0.05)
    came = await marks_within(queue, 0.3)
    assert len(came) == 1 and came[0] >= 0.045


async def test_a_later_deadline_leaves_the_armed_wake_alone():
    """The loop learns at the early wake that its deadline moved, and asks again."""
    queue: asyncio.Queue = asyncio.Queue()
    wake = WakeTimer(lambda: queue.put_nowait(MARK))
    now = time.monotonic()
    wake.at(now + 0.05)
    for later in (0.1, 0.2, 10.0):
        wake.at(now + later)
    came = await marks_within(queue, 0.3)
    assert len(came) == 1 and came[0] < 0.1
    wake.at(time.monotonic() + 0.05)  # asked again after the wake: armed again
    assert len(await marks_within(queue, 0.3)) == 1


async def test_an_earlier_deadline_replaces_the_armed_one():
    queue: asyncio.Queue = asyncio.Queue()
    wake = WakeTimer(lambda: queue.put_nowait(MARK))
    now = time.monotonic()
    wake.at(now + 0.25)
    wake.at(now + 0.02)
    came = await marks_within(queue, 0.4)
    assert len(came) == 1 and came[0] < 0.2  # one mark, at the earlier time; none at the first


async def test_a_deadline_already_past_wakes_at_once_and_none_or_cancel_wakes_never():
    queue: asyncio.Queue = asyncio.Queue()
    wake = WakeTimer(lambda: queue.put_nowait(MARK))
    wake.at(time.monotonic() - 1)
    assert len(await marks_within(queue, 0.05)) == 1
    wake.at(None)
    wake.at(float("inf"))
    wake.at(time.monotonic() + 0.05)
    wake.cancel()
    assert await marks_within(queue, 0.15) == []
