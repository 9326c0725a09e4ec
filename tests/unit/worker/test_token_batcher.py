import asyncio
import time

import pytest

from steno.services.worker.engine import EngineError, EngineOutput
from steno.services.worker.token_batcher import WIDE_HOLD_S, CoalescingWindow, coalesce


def started(store):
    """A flush that starts ``store(batch)`` and hands back its future."""
    return lambda batch: asyncio.ensure_future(store(batch))


async def source(outputs, gap_s=0.0, fail=False):
    for output in outputs:
        if gap_s:
            await asyncio.sleep(gap_s)
        yield output
    if fail:
        raise EngineError("boom")


def run(outputs, interval_s, max_tokens, gap_s=0.0, fail=False, eager_tokens=1):
    flushed = []

    async def flush(batch):
        flushed.append(list(batch.token_ids))

    async def go():
        return await coalesce(source(outputs, gap_s, fail), started(flush), interval_s, max_tokens,
                              eager_tokens=eager_tokens)

    last, tail = asyncio.run(go())
    # The last batch is returned to go out with the end; here it goes out after the others.
    return last, flushed + ([list(tail.token_ids)] if tail.token_ids else [])


def test_the_first_tokens_go_out_as_they_come_then_are_coalesced():
    outputs = [EngineOutput([i]) for i in range(9)] + [EngineOutput([9], finish_reason="stop")]
    _, flushed = run(outputs, interval_s=10, max_tokens=100, gap_s=0.005, eager_tokens=4)
    assert flushed == [[0], [1], [2], [3], [4, 5, 6, 7, 8, 9]]


def test_outputs_that_queued_up_during_a_flush_share_the_next_batch():
    flushed = []

    async def slow_flush(batch):
        flushed.append(list(batch.token_ids))
        await asyncio.sleep(0.05)

    async def go():
        outputs = [EngineOutput([i]) for i in range(5)] + [EngineOutput([5], finish_reason="stop")]
        _, tail = await coalesce(source(outputs, gap_s=0.01), started(slow_flush), 10, 100, eager_tokens=100)
        flushed.append(list(tail.token_ids))

    asyncio.run(go())
    assert flushed[0] == [0] and len(flushed) < 6
    assert sum(flushed, []) == list(range(6))


def test_a_batch_goes_one_interval_after_the_previous_one():
    outputs = [EngineOutput([i]) for i in range(8)] + [EngineOutput([8], finish_reason="stop")]
    _, flushed = run(outputs, interval_s=0.03, max_tokens=100, gap_s=0.01)
    assert flushed[0] == [0]
    assert 2 <= len(flushed) <= 5  # about one per 30 ms over 90 ms, not one per token
    assert sum(flushed, []) == list(range(9))


def test_size_cap_splits_batches_and_keeps_every_token():
    outputs = [EngineOutput([i]) for i in range(10)] + [EngineOutput([10], finish_reason="stop")]
    last, flushed = run(outputs, interval_s=10, max_tokens=4)
    assert sum(flushed, []) == list(range(11))
    assert all(len(b) <= 4 for b in flushed[:-1])
    assert last.finish_reason == "stop"


def test_interval_flushes_slow_streams():
    outputs = [EngineOutput([i]) for i in range(3)] + [EngineOutput([], finish_reason="stop")]
    _, flushed = run(outputs, interval_s=0.01, max_tokens=100, gap_s=0.05)
    assert flushed == [[0], [1], [2]]


def test_a_stream_quiet_for_most_of_an_interval_sends_its_token_at_once():
    """A token 0.8 interval after the last batch goes at once, alone; one right behind it
    waits its interval (held to the full interval, the two would have gone together)."""
    timeline = [(0.0, EngineOutput([0])), (0.16, EngineOutput([1])), (0.02, EngineOutput([2])),
                (0.3, EngineOutput([], finish_reason="stop"))]
    flushed: list[list[int]] = []

    async def source():
        for delay, output in timeline:
            await asyncio.sleep(delay)
            yield output

    async def flush(batch):
        flushed.append(list(batch.token_ids))

    asyncio.run(coalesce(source(), started(flush), 0.2, 100, eager_tokens=1))
    assert flushed == [[0], [1], [2]]


def test_engine_error_propagates_after_flushing():
    with pytest.raises(EngineError):
        run([EngineOutput([1, 2])], interval_s=10, max_tokens=100, fail=True)


def test_logprobs_follow_their_tokens():
    flushed = []

    async def flush(batch):
        flushed.append((batch.token_ids, batch.logprobs))

    async def go():
        outputs = [EngineOutput([1], logprobs=[-1.0]), EngineOutput([2], logprobs=[-2.0], finish_reason="stop")]
        _, tail = await coalesce(source(outputs), started(flush), 10, 100)
        await flush(tail)

    asyncio.run(go())
    assert all(len(tokens) == len(logprobs) for tokens, logprobs in flushed)
    assert [t for tokens, _ in flushed for t in tokens] == [1, 2]
    assert [p for _, logprobs in flushed for p in logprobs] == [-1.0, -2.0]


def test_silence_longer_than_the_keepalive_flushes_empty_batches():
    flushed = []

    async def flush(batch):
        flushed.append(list(batch.token_ids))

    async def go():
        async def slow():
            await asyncio.sleep(0.25)
            yield EngineOutput([7], finish_reason="stop")

        return await coalesce(slow(), started(flush), 0.01, 100, keepalive_s=0.1)

    last, tail = asyncio.run(go())
    assert flushed[:2] == [[], []]
    assert tail.token_ids == [7] and last.finish_reason == "stop"  # it goes out with the end


def test_the_last_batch_is_returned_to_go_out_with_the_end():
    flushed = []

    async def flush(batch):
        flushed.append(list(batch.token_ids))

    async def go():
        outputs = [EngineOutput([1]), EngineOutput([2]), EngineOutput([3], finish_reason="length")]
        return await coalesce(source(outputs, gap_s=0.005), started(flush), 10, 100, eager_tokens=1)

    last, tail = asyncio.run(go())
    assert flushed == [[1]]
    assert tail.token_ids == [2, 3] and last.finish_reason == "length"


def test_each_batch_carries_when_its_first_and_last_tokens_were_emitted():
    yielded_at: dict[int, float] = {}
    flushed = []

    async def timed_source():
        for i in range(6):
            await asyncio.sleep(0.01)
            yielded_at[i] = time.time()
            yield EngineOutput([i], finish_reason="stop" if i == 5 else None)

    async def flush(batch):
        flushed.append((list(batch.token_ids), batch.first_emitted_at, batch.emitted_at))

    async def go():
        _, tail = await coalesce(timed_source(), started(flush), 0.025, 100, keepalive_s=0.005, eager_tokens=2)
        flushed.append((list(tail.token_ids), tail.first_emitted_at, tail.emitted_at))

    asyncio.run(go())
    with_tokens = [batch for batch in flushed if batch[0]]
    assert sum((tokens for tokens, _, _ in with_tokens), []) == list(range(6))
    assert any(len(tokens) > 1 for tokens, _, _ in with_tokens)  # the first and the last differ somewhere
    for tokens, first_emitted_at, emitted_at in with_tokens:
        first, last = tokens[0], tokens[-1]
        assert yielded_at[first] <= first_emitted_at < yielded_at.get(first + 1, float("inf"))
        assert yielded_at[last] <= emitted_at < yielded_at.get(last + 1, float("inf"))
    # keepalives emit nothing
    assert all(first is None and last is None for tokens, first, last in flushed if not tokens)


def test_one_batch_is_in_flight_at_a_time_and_the_end_waits_for_it():
    """Eager tokens too wait for the batch before them to be stored; the last batch is
    handed back only once every batch before it is."""
    in_flight = 0
    most_in_flight = 0
    stored: list[list[int]] = []

    async def store(batch):
        nonlocal in_flight, most_in_flight
        in_flight += 1
        most_in_flight = max(most_in_flight, in_flight)
        await asyncio.sleep(0.02)
        stored.append(list(batch.token_ids))
        in_flight -= 1

    async def go():
        outputs = [EngineOutput([i]) for i in range(6)] + [EngineOutput([6], finish_reason="stop")]
        _, tail = await coalesce(source(outputs, gap_s=0.005), started(store), 10, 100, eager_tokens=100)
        assert in_flight == 0
        return tail

    tail = asyncio.run(go())
    assert most_in_flight == 1
    assert stored[0] == [0] and len(stored) < 6
    assert sum(stored, []) + tail.token_ids == list(range(7))


def test_a_batch_not_stored_fails_the_call_while_the_engine_is_silent():
    class Refused(Exception):
        pass

    async def refuse(batch):
        raise Refused

    async def silent_after_one():
        yield EngineOutput([1])
        await asyncio.sleep(30)
        yield EngineOutput([2], finish_reason="stop")

    async def go():
        started_at = time.monotonic()
        with pytest.raises(Refused):
            await coalesce(silent_after_one(), started(refuse), 10, 100)
        return time.monotonic() - started_at

    assert asyncio.run(go()) < 5


def test_a_cancelled_reader_is_cancelled_not_failed():
    """Shutting down cancels the attempt's task: that stays a cancellation, and the
    batch in flight is let go."""
    async def go():
        began = asyncio.Event()

        async def slow_store(batch):
            began.set()
            await asyncio.sleep(30)

        async def endless():
            for i in range(1000):
                await asyncio.sleep(0.001)
                yield EngineOutput([i])

        reading = asyncio.create_task(coalesce(endless(), started(slow_store), 10, 100))
        await began.wait()
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading

    asyncio.run(go())


def test_a_batch_stored_as_the_engine_finishes_is_settled_before_the_end():
    """The batch in flight is stored in the very step in which the engine finishes: the
    call returns only after that batch's own callbacks ran (the worker numbers the last
    batch after them; a number used twice would be dropped as a duplicate)."""
    settled: list[list[int]] = []
    in_flight: list[asyncio.Future] = []

    def flush(batch):
        stored = asyncio.get_running_loop().create_future()
        stored.add_done_callback(lambda _: settled.append(list(batch.token_ids)))
        in_flight.append(stored)
        return stored

    async def source():
        yield EngineOutput([1])
        in_flight[0].set_result(None)  # stored while the reader is still reading
        yield EngineOutput([2], finish_reason="stop")

    async def go():
        _, tail = await coalesce(source(), flush, 10, 100, eager_tokens=100)
        return list(settled), tail

    settled_at_the_end, tail = asyncio.run(go())
    assert settled_at_the_end == [[1]]
    assert tail.token_ids == [2]


def test_a_batch_that_cannot_be_sent_fails_the_call_and_lets_the_engine_go():
    let_go = []

    def unsendable(batch):
        raise ValueError("cannot encode")

    async def engine():
        try:
            for i in range(100):
                yield EngineOutput([i])
        finally:
            let_go.append(True)

    with pytest.raises(ValueError):
        asyncio.run(coalesce(engine(), unsendable, 10, 100))
    assert let_go == [True]


def holds(window: CoalescingWindow, count: int, held: bool, now: float = 0.0) -> None:
    for _ in range(count):
        window.record(held, now)


def test_a_workers_window_widens_once_many_batches_were_held_up_by_a_store():
    window = CoalescingWindow(0.02)
    holds(window, 50_000, held=False)
    holds(window, 500, held=True)  # a burst: the running share moves only part of the way
    assert window.window_s == 0.02 and not window.widened
    holds(window, 20_000, held=True)
    assert window.widened and window.window_s == pytest.approx(0.04)


def test_one_batch_in_twenty_held_up_keeps_the_base_interval():
    window = CoalescingWindow(0.02)
    for _ in range(10_000):
        window.record(True, 0.0)
        holds(window, 19, held=False)
    assert window.window_s == 0.02
    assert window.held_share == pytest.approx(0.05, abs=0.02)


def test_a_wide_window_holds_then_tries_the_base_interval_again():
    window = CoalescingWindow(0.02)
    holds(window, 30_000, held=True)
    assert window.widened
    holds(window, 1_000, held=False, now=WIDE_HOLD_S / 2)  # what it sees while wide says nothing
    assert window.widened
    window.record(False, WIDE_HOLD_S + 0.001)
    assert not window.widened
    # Where the batches are still held up, it widens again sooner than from nothing ...
    holds(window, 300, held=True, now=WIDE_HOLD_S + 0.002)
    assert window.widened
    # ... and where they are not it stays at the base interval.
    window.record(False, 3 * WIDE_HOLD_S)
    holds(window, 50_000, held=False, now=3 * WIDE_HOLD_S)
    assert window.window_s == 0.02


def test_a_fixed_interval_never_widens():
    window = CoalescingWindow(0.02, adaptive=False)
    holds(window, 50_000, held=True)
    assert window.window_s == 0.02


def stepped(window: CoalescingWindow, step_s: float, store_s: float, steps: int, eager_tokens: int = 1
            ) -> list[tuple[list[int], float]]:
    """A stream whose engine makes a token every ``step_s``, each batch taking ``store_s``
    to store: each batch with how long its first token waited to be sent (the last
    batch, which goes with the end, with none)."""
    sent: list[tuple[list[int], float]] = []

    async def engine():
        for i in range(steps):
            yield EngineOutput([i])
            await asyncio.sleep(step_s)
        yield EngineOutput([], finish_reason="stop")

    async def store(batch):
        sent.append((list(batch.token_ids), time.time() - batch.first_emitted_at))
        await asyncio.sleep(store_s)

    _, tail = asyncio.run(coalesce(engine(), started(store), window, 100, eager_tokens=eager_tokens))
    return sent + ([(list(tail.token_ids), 0.0)] if tail.token_ids else [])


def test_a_token_per_interval_goes_on_its_step_though_each_store_takes_most_of_one():
    """The interval counts from the batch before's sending: a store that takes 0.12 of a
    0.2 s step leaves the next step's token free to go when it comes (counted from the
    store, it would wait 0.12 s for the interval's end)."""
    window = CoalescingWindow(0.2)
    sent = stepped(window, step_s=0.2, store_s=0.12, steps=5)
    assert [tokens for tokens, _ in sent] == [[0], [1], [2], [3], [4]]
    assert max(waited for _, waited in sent) < 0.06
    assert window.held_share == 0.0


def test_tokens_that_come_while_the_batch_before_is_stored_are_counted_as_held_up():
    window = CoalescingWindow(0.02)
    sent = stepped(window, step_s=0.02, store_s=0.05, steps=12)
    assert sum((tokens for tokens, _ in sent), []) == list(range(12))
    assert len(sent) < 12  # those that came during a store went together once it was stored
    assert window.held_share > 0.0


def test_a_widened_window_gathers_the_next_steps_token_into_the_batch():
    """Tokens every 0.16 s: at the base interval (0.2 s) each goes alone (quiet for 3/4 of
    it); once the worker's window is wide (0.4 s) they go two by two."""
    window = CoalescingWindow(0.2)
    holds(window, 30_000, held=True, now=time.monotonic())
    assert window.widened
    flushed: list[list[int]] = []

    async def steps():
        for i in range(5):
            yield EngineOutput([i])
            await asyncio.sleep(0.16)
        yield EngineOutput([], finish_reason="stop")

    async def flush(batch):
        flushed.append(list(batch.token_ids))

    _, tail = asyncio.run(coalesce(steps(), started(flush), window, 100, eager_tokens=1))
    # The last batch goes with the end (here after the others), whichever batch that is.
    assert flushed + ([list(tail.token_ids)] if tail.token_ids else []) == [[0], [1, 2], [3, 4]]
