"""Group commit: concurrent writes share statements, and a bad one fails alone."""

import asyncio

import pytest

from steno.services.common.group_commit import GroupCommitter


class RecordingLog:
    """Stands in for Postgres: records each statement's writes; fails any statement that
    holds a response named in ``poisoned``."""

    def __init__(self, poisoned: frozenset[str] = frozenset()) -> None:
        self.statements: list[list[str]] = []
        self.poisoned = poisoned

    async def commit(self, writes: list[str]) -> None:
        ids = list(writes)
        await asyncio.sleep(0.01)  # the round trip, during which others arrive
        if self.poisoned & set(ids):
            raise RuntimeError(f"violates a constraint: {sorted(self.poisoned & set(ids))}")
        self.statements.append(ids)


async def test_a_lone_write_is_committed_at_once_in_its_own_statement():
    log = RecordingLog()
    await GroupCommitter(log.commit).commit(["resp_a"])
    assert log.statements == [["resp_a"]]


async def test_writes_arriving_during_a_commit_share_the_next_statement():
    log = RecordingLog()
    committer = GroupCommitter(log.commit)
    first = asyncio.create_task(committer.commit(["resp_0"]))
    await asyncio.sleep(0.001)  # the first statement is in flight
    rest = [asyncio.create_task(committer.commit([f"resp_{i}"])) for i in range(1, 16)]
    await asyncio.gather(first, *rest)
    assert log.statements == [["resp_0"], [f"resp_{i}" for i in range(1, 16)]]


async def test_a_failing_write_fails_only_its_own_caller():
    log = RecordingLog(poisoned=frozenset({"resp_bad"}))
    committer = GroupCommitter(log.commit)
    first = asyncio.create_task(committer.commit(["resp_0"]))
    await asyncio.sleep(0.001)
    good = asyncio.create_task(committer.commit(["resp_good"]))
    bad = asyncio.create_task(committer.commit(["resp_bad"]))
    other = asyncio.create_task(committer.commit(["resp_other"]))
    await asyncio.gather(first, good, other)
    with pytest.raises(RuntimeError, match="resp_bad"):
        await bad
    assert sorted(sum(log.statements, [])) == ["resp_0", "resp_good", "resp_other"]


async def test_after_a_failure_later_writes_are_grouped_again():
    log = RecordingLog(poisoned=frozenset({"resp_bad"}))
    committer = GroupCommitter(log.commit)
    with pytest.raises(RuntimeError):
        await committer.commit(["resp_bad"])
    await asyncio.gather(*(committer.commit([f"resp_{i}"]) for i in range(3)))
    assert log.statements == [["resp_0", "resp_1", "resp_2"]]
