import asyncio
import time

import pytest

from steno.services.worker.engine import EngineError, EngineOutput
from steno.services.worker.token_batcher import coalesce


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
        return await coalesce(source(outputs, gap_s, fail), flush, interval_s, max_tokens, eager_tokens=eager_tokens)

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
        _, tail = await coalesce(source(outputs, gap_s=0.01), slow_flush, 10, 100, eager_tokens=100)
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

    asyncio.run(coalesce(source(), flush, 0.2, 100, eager_tokens=1))
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
        _, tail = await coalesce(source(outputs), flush, 10, 100)
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

        return await coalesce(slow(), flush, 0.01, 100, keepalive_s=0.1)

    last, tail = asyncio.run(go())
    assert flushed[:2] == [[], []]
    assert tail.token_ids == [7] and last.finish_reason == "stop"  # it goes out with the end


def test_the_last_batch_is_returned_to_go_out_with_the_end():
    flushed = []

    async def flush(batch):
        flushed.append(list(batch.token_ids))

    async def go():
        outputs = [EngineOutput([1]), EngineOutput([2]), EngineOutput([3], finish_reason="length")]
        return await coalesce(source(outputs, gap_s=0.005), flush, 10, 100, eager_tokens=1)

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
        _, tail = await coalesce(timed_source(), flush, 0.025, 100, keepalive_s=0.005, eager_tokens=2)
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
