"""A live in-memory copy of a KV bucket's keys, fed by one watcher per process.

Hot paths (is this response cancelled? does a worker serve this model?) ask memory
instead of making a JetStream API round trip per request. The copy may lag the bucket by
a message's flight time, and while NATS is down it stops changing; callers that must not
act on a stale answer confirm it with a direct read (see ``confirm``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import suppress
from datetime import UTC, datetime

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from steno.services.common.bus import patiently

log = logging.getLogger(__name__)

RESTART_DELAY_S = 1.0
# The watcher's end-of-keys marker can come before keys the server has already sent; the
# start waits for the newest key it found, at most this long (it may lapse meanwhile).
CATCH_UP_S = 5.0

OnPut = Callable[[str, bytes], Awaitable[None]]
OnForget = Callable[[str], None]


class KvMirror:
    def __init__(self, kv: KeyValue, name: str, forget_after_s: float, on_put: OnPut | None = None,
                 on_forget: OnForget | None = None) -> None:
        """``forget_after_s``: the bucket's TTL (an expired key sends no delete, so the
        copy forgets it itself). ``on_put`` runs for every key the copy learns of, the
        ones already there at the start included; ``on_forget`` for every key it drops,
        deleted or lapsed (a lapsed one when the copy next changes)."""
        self._kv = kv
        self._name = name
        self._forget_after_s = forget_after_s
        self._on_put = on_put
        self._on_forget = on_forget
        # key -> (monotonic time of its latest put, its value), oldest first
        self._seen: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Returns once the bucket's current keys are in memory; a JetStream that does not
        answer yet is waited for as any start-up request is (``bus.patiently``)."""
        await patiently(self._begin_following, f"watching bucket {self._name}")

    async def _begin_following(self) -> None:
        loaded = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._follow(loaded))
        await loaded

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def __contains__(self, key: str) -> bool:
        return self.age_s(key) is not None

    def age_s(self, key: str) -> float | None:
        """Seconds since ``key`` was last written, or None if it is not in the bucket."""
        seen = self._seen.get(key)
        if seen is None:
            return None
        age = time.monotonic() - seen[0]
        return age if age < self._forget_after_s else None

    def items(self) -> list[tuple[str, bytes]]:
        """Every key in the bucket with its latest value."""
        return [(key, seen[1]) for key, seen in list(self._seen.items()) if key in self]

    def get(self, key: str) -> bytes | None:
        """The latest value of ``key``, or None if it is not in the bucket."""
        seen = self._seen.get(key)
        return seen[1] if seen is not None and key in self else None

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Waits until ``predicate()`` holds after some change, at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return predicate()
        return True

    async def fetch(self, key: str) -> bytes | None:
        """Reads ``key`` from the bucket itself (one round trip); None if it is not there."""
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            return None
        return entry.value or b""

    async def _follow(self, loaded: asyncio.Future) -> None:
        while True:
            try:
                await self._watch_once(loaded)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not loaded.done():
                    loaded.set_exception(exc)
                    return
                log.warning("watching bucket %s failed (%s); watching again", self._name, exc)
                await asyncio.sleep(RESTART_DELAY_S)

    async def _watch_once(self, loaded: asyncio.Future) -> None:
        """Follows the bucket until the connection to NATS is re-established (the server's
        side of the watcher may be gone then); the caller watches again, and the keys
        come again, with what changed meanwhile."""
        nc = self._kv._js._nc
        reconnects = nc.stats["reconnects"]
        # The bucket's newest message now: the copy holds the keys once it has come too.
        state = (await self._kv._js.stream_info(self._kv._stream)).state
        newest = state.last_seq if state.messages else 0
        watcher = await self._kv.watchall()

        async def stop_on_reconnect() -> None:
            while nc.stats["reconnects"] == reconnects:
                await asyncio.sleep(RESTART_DELAY_S)
            await watcher.stop()

        guard = asyncio.create_task(stop_on_reconnect())
        initial = True
        caught_up, marked = newest == 0, False

        def load() -> None:
            if not loaded.done():
                loaded.set_result(None)

        try:
            async for entry in watcher:
                if entry is None:  # the current keys are all sent
                    marked = True
                else:
                    # Keys already there when the watch starts are as old as the bucket says.
                    await self._apply(entry.key, entry.value, entry.operation,
                                      _age_s(entry.created) if initial else 0.0)
                    caught_up = caught_up or entry.revision >= newest
                if initial and marked:
                    if caught_up:
                        initial = False
                        load()
                    elif entry is None:
                        asyncio.get_running_loop().call_later(CATCH_UP_S, load)
        finally:
            guard.cancel()
            with suppress(Exception):
                await watcher.stop()

    async def _apply(self, key: str, value: bytes, operation: str | None, age_s: float) -> None:
        known = self._seen.pop(key, None)
        if operation in (KV_DEL, KV_PURGE):
            if known is not None and self._on_forget is not None:
                self._on_forget(key)
            self._changed.set()
            return
        self._seen[key] = (time.monotonic() - age_s, value or b"")
        self._forget_expired()
        self._changed.set()
        if self._on_put is not None and key in self:
            try:
                await self._on_put(key, value)
            except Exception:
                log.exception("handling a write of %s failed", key)

    def _forget_expired(self) -> None:
        horizon = time.monotonic() - self._forget_after_s
        while self._seen:
            key, (seen, _) = next(iter(self._seen.items()))
            if seen >= horizon:
                break
            del self._seen[key]
            if self._on_forget is not None:
                self._on_forget(key)


def _age_s(created: datetime | None) -> float:
    if created is None:
        return 0.0
    return max(0.0, (datetime.now(UTC) - created).total_seconds())
