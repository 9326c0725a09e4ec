"""When a held message may have gone to another holder, on a clock the test moves."""

import asyncio

from steno.services.common.in_progress import BEAT_S, LAPSE_S, InProgress


class Delivery:
    """Stands in for a JetStream message: what is held is only beaten."""

    def __init__(self) -> None:
        self.beats = 0

    async def in_progress(self) -> None:
        self.beats += 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def beats(held: InProgress, clock: Clock, count: int, every_s: float = BEAT_S) -> None:
    for _ in range(count):
        clock.now += every_s
        asyncio.run(held.beat())


def test_a_message_beaten_on_time_stays_its_holder_s():
    clock = Clock()
    held = InProgress(clock)
    message = Delivery()
    held.hold(message)  # before the first beat: a holder just started has stopped for nothing
    beats(held, clock, 20)
    assert message.beats == 20 and not held.lapsed(message)


def test_a_gap_between_beats_past_the_lapse_is_remembered():
    clock = Clock()
    held = InProgress(clock)
    message, other = Delivery(), Delivery()
    beats(held, clock, 2)
    held.hold(message)
    beats(held, clock, 2)
    clock.now += LAPSE_S - BEAT_S / 2  # late, but within the lapse: still its own
    asyncio.run(held.beat())
    assert not held.lapsed(message)
    clock.now += LAPSE_S
    assert held.lapsed(message)  # asked before the late beat
    asyncio.run(held.beat())
    beats(held, clock, 3)
    assert held.lapsed(message)  # and after it, however many beats follow
    held.hold(other)
    assert not held.lapsed(other)
    held.release(message)
    assert not held.lapsed(message)  # released: nothing to say


def test_a_message_read_as_its_holder_wakes_from_a_stop_may_be_another_s():
    clock = Clock()
    held = InProgress(clock)
    beats(held, clock, 3)
    clock.now += 2 * LAPSE_S  # stopped
    before_the_late_beat = Delivery()
    held.hold(before_the_late_beat)
    asyncio.run(held.beat())
    clock.now += BEAT_S / 3
    after_it = Delivery()
    held.hold(after_it)
    beats(held, clock, 1)
    a_beat_later = Delivery()
    held.hold(a_beat_later)
    assert held.lapsed(before_the_late_beat) and held.lapsed(after_it)
    assert not held.lapsed(a_beat_later)


def test_a_holder_stopped_just_after_it_starts_keeping_knows_what_reached_it_meanwhile():
    clock = Clock()
    held = InProgress(clock)

    async def stopped_after_the_first_beat() -> None:
        keeping = asyncio.create_task(held.keep())
        await asyncio.sleep(0)  # the first beat, at once
        keeping.cancel()
        clock.now += 2 * LAPSE_S  # stopped before the next
        message = Delivery()
        held.hold(message)
        assert held.lapsed(message)

    asyncio.run(stopped_after_the_first_beat())
