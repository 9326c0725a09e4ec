"""Group commit: writes that arrive while a commit is in flight go together in the next
one, so a burst of new responses in the API costs Postgres a few statements and WAL
flushes instead of one each.

A group that fails is retried member by member, so one bad write (a response deleted
mid-stream, say) fails only its own caller."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

Write = TypeVar("Write")


class GroupCommitter(Generic[Write]):
    """``commit`` writes a list of writes in one statement, atomically."""

    def __init__(self, commit: Callable[[list[Write]], Awaitable[None]]) -> None:
        self._commit = commit
        self._waiting: list[tuple[list[Write], asyncio.Future]] = []
        self._committing: asyncio.Task | None = None

    async def commit(self, writes: list[Write]) -> None:
        """Returns once ``writes`` are committed; raises what their commit raised."""
        done = asyncio.get_running_loop().create_future()
        self._waiting.append((writes, done))
        if self._committing is None:
            self._committing = asyncio.create_task(self._commit_waiting())
        await done

    async def _commit_waiting(self) -> None:
        group: list[tuple[list[Write], asyncio.Future]] = []
        try:
            while self._waiting:
                group, self._waiting = self._waiting, []
                await self._commit_group(group)
        finally:
            self._committing = None
            # Only when cancelled (the parser is stopping): nothing more is committed.
            for _, done in group + self._waiting:
                _settle(done, asyncio.CancelledError())
            self._waiting = []

    async def _commit_group(self, group: list[tuple[list[Write], asyncio.Future]]) -> None:
        try:
            await self._commit([write for writes, _ in group for write in writes])
        except Exception as exc:
            if len(group) == 1:
                _settle(group[0][1], exc)
                return
            log.warning("a group of %d commits failed (%s); committing them one by one", len(group), exc)
            for writes, done in group:
                try:
                    await self._commit(writes)
                except Exception as single:
                    _settle(done, single)
                else:
                    _settle(done, None)
        else:
            for _, done in group:
                _settle(done, None)


def _settle(done: asyncio.Future, error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
