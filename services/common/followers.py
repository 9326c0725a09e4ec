"""Which API processes follow a response another API process made, so that the parser
announces its events to them too (KV bucket ``ns_followers``, key
``<response_id>.<origin>``).

Each API process receives the parser's announcements on one subject of its own
(``ns.events.<origin>``), one message per commit for all the responses it made and all
it follows. Following a response made elsewhere (a stream resumed on another replica, a
background response collected from another) puts a key here; every parser watches the
bucket into memory. What a parser commits before it sees the key is not announced to the
new follower: its tail reads that from Postgres when the next announcement shows the gap,
or when it polls."""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

from nats.js.kv import KeyValue

from steno.services.common.bus import FOLLOW_TTL_S
from steno.services.common.kv_mirror import KvMirror

log = logging.getLogger(__name__)

# A process that dies leaves its keys to lapse; until then parsers announce to its
# subject, which nobody reads.
REFRESH_S = FOLLOW_TTL_S / 4


def follow_key(response_id: str, origin: str) -> str:
    return f"{response_id}.{origin}"


class FollowRegistry:
    """An API process's keys in the bucket: one per response it follows from elsewhere,
    however many of its streams follow it."""

    def __init__(self, kv: KeyValue, origin: str) -> None:
        self._kv = kv
        self._origin = origin
        self._streams: dict[str, int] = {}
        self._refreshing: asyncio.Task | None = None

    async def start(self) -> None:
        self._refreshing = asyncio.create_task(self._refresh())

    async def stop(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            await asyncio.gather(self._refreshing, return_exceptions=True)
        for response_id in list(self._streams):
            with suppress(Exception):
                await self._kv.delete(follow_key(response_id, self._origin))
        self._streams.clear()

    async def follow(self, response_id: str) -> None:
        """Raises if NATS does not take the key; the stream is counted as following anyway,
        so ``unfollow`` pairs with every call."""
        streams = self._streams.get(response_id, 0)
        self._streams[response_id] = streams + 1
        if streams == 0:
            await self._put(response_id)

    async def unfollow(self, response_id: str) -> None:
        streams = self._streams.pop(response_id, 0) - 1
        if streams > 0:
            self._streams[response_id] = streams
            return
        with suppress(Exception):
            await self._kv.delete(follow_key(response_id, self._origin))

    async def _put(self, response_id: str) -> None:
        await self._kv.put(follow_key(response_id, self._origin), b"1")

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            for response_id in list(self._streams):
                try:
                    await self._put(response_id)
                except Exception as exc:
                    log.warning("refreshing the follow of %s failed (%s)", response_id, exc)


class Followers:
    """A parser's copy of the bucket: the API processes, other than a response's origin,
    that follow it. Knows of none until ``start``."""

    def __init__(self) -> None:
        self._mirror: KvMirror | None = None
        # response id -> the origins whose keys were seen for it (some may have lapsed since)
        self._origins: dict[str, set[str]] = {}

    async def start(self, kv: KeyValue, bucket: str) -> None:
        self._mirror = KvMirror(kv, bucket, FOLLOW_TTL_S, on_put=self._learned, on_forget=self._forgot)
        await self._mirror.start()

    async def stop(self) -> None:
        if self._mirror is not None:
            await self._mirror.stop()

    def of(self, response_id: str) -> list[str]:
        origins = self._origins.get(response_id)
        if not origins or self._mirror is None:
            return []
        return [origin for origin in origins if follow_key(response_id, origin) in self._mirror]

    async def _learned(self, key: str, value: bytes) -> None:
        response_id, _, origin = key.rpartition(".")
        self._origins.setdefault(response_id, set()).add(origin)

    def _forgot(self, key: str) -> None:
        response_id, _, origin = key.rpartition(".")
        origins = self._origins.get(response_id)
        if origins is not None:
            origins.discard(origin)
            if not origins:
                del self._origins[response_id]
