"""Token batches that are ready at the same moment go to JetStream together: one
``TokenBatchGroup`` per token partition instead of one message per response.

An engine's step makes a token for every running request at once, so every stream's
batch is flushed within the same turn of the event loop; each message costs the worker,
NATS and the parser about the same whatever it carries (a store, an acknowledgement,
a delivery and an ack), so one message per partition and step costs a fraction of one
per response. A batch waits for nothing it would not have waited for alone: the group
goes out at the end of the turn in which its first batch came, and every batch's future
resolves once the group is stored, as after a publish of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson

from steno.services.common.bus import Names, partition_of
from steno.services.common.stored_publish import StoredPublisher
from steno.services.common.tracing import message_headers

# Stores one batch on its own (subject, body, message id, headers), riding out trouble.
Alone = Callable[[str, bytes, str, dict[str, str]], Awaitable[None]]

# A group's body stays this far under the bus's message limit (the envelope of each
# batch, and a margin for headers).
ENVELOPE_BYTES = 256


@dataclass(frozen=True)
class Carried:
    """The headers every batch of one attempt carries beside its message id (trace
    context, tenant), with the head of a group member that carries them, encoded once
    per attempt rather than once per batch."""

    headers: dict[str, str]
    member_head: bytes

    @classmethod
    def of(cls, headers: dict[str, str]) -> Carried:
        return cls(headers, b'{"headers":' + orjson.dumps(headers) + b',"batch":')


@dataclass
class _Grouped:
    response_id: str
    body: bytes
    carried: Carried
    msg_id: str
    # A future per batch, not one the group's batches share: a caller cancelled while it
    # waits cancels what it awaits, and each batch of a group that failed settles alone.
    stored: asyncio.Future[None]


@dataclass
class _Forming:
    batches: list[_Grouped] = field(default_factory=list)
    size: int = 0


class BatchGroups:
    """``publish`` stores a batch, in a group with the other batches of its partition
    published in the same turn of the event loop; a batch that finds no company goes
    as a message of its own, on its response's subject. With ``alone``, each batch of a
    group that could not be stored goes again on its own through it; without, it fails."""

    def __init__(self, publisher: StoredPublisher, names: Names, message_limit: int,
                 alone: Alone | None = None) -> None:
        self._publisher = publisher
        self._names = names
        self._limit = message_limit
        self._alone = alone
        self._forming: dict[int, _Forming] = {}
        self._sending = False
        self._tasks: set[asyncio.Task[None]] = set()

    def publish(self, response_id: str, body: bytes, msg_id: str, carried: Carried) -> asyncio.Future[None]:
        """Starts storing the batch: the future resolves once it is stored, alone or in a
        group, or fails as ``StoredPublisher.publish`` (or ``alone``) does."""
        loop = asyncio.get_running_loop()
        grouped = _Grouped(response_id, body, carried, msg_id, loop.create_future())
        partition = partition_of(response_id, self._names.token_partitions)
        forming = self._forming.setdefault(partition, _Forming())
        added = len(body) + len(carried.member_head) + ENVELOPE_BYTES
        if forming.batches and forming.size + added > self._limit:
            self._send(partition, self._forming.pop(partition))
            forming = self._forming.setdefault(partition, _Forming())
        forming.batches.append(grouped)
        forming.size += added
        if not self._sending:
            self._sending = True
            loop.call_soon(self._send_forming)
        return grouped.stored

    def _send_forming(self) -> None:
        self._sending = False
        forming, self._forming = self._forming, {}
        for partition, group in forming.items():
            self._send(partition, group)

    def _send(self, partition: int, group: _Forming) -> None:
        task = asyncio.get_running_loop().create_task(self._store(partition, group.batches))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _store(self, partition: int, batches: list[_Grouped]) -> None:
        try:
            if len(batches) == 1:
                alone = batches[0]
                await self._publisher.publish(self._names.tokens_subject(alone.response_id), alone.body,
                                              message_headers(alone.msg_id, alone.carried.headers))
            else:
                body = group_body([(grouped.carried.member_head, grouped.body) for grouped in batches])
                await self._publisher.publish(self._names.tokens_group_subject(partition), body,
                                              {"Nats-Msg-Id": f"group:{batches[0].msg_id}"})
        except Exception as exc:
            if self._alone is None:
                for grouped in batches:
                    _settle(grouped, exc)
                return
            for grouped in batches:
                try:
                    await self._alone(self._names.tokens_subject(grouped.response_id), grouped.body, grouped.msg_id,
                                      grouped.carried.headers)
                except Exception as alone_exc:
                    _settle(grouped, alone_exc)
                else:
                    _settle(grouped, None)
            return
        for grouped in batches:
            _settle(grouped, None)


def _settle(grouped: _Grouped, failure: Exception | None) -> None:
    if grouped.stored.done():
        return  # its caller gave up waiting
    if failure is None:
        grouped.stored.set_result(None)
    else:
        grouped.stored.set_exception(failure)


def group_body(members: list[tuple[bytes, bytes]]) -> bytes:
    """A ``TokenBatchGroup`` of batches already encoded, each after the head that carries
    its headers (``Carried.member_head``): spliced, not encoded again."""
    return b'{"kind":"group","v":1,"batches":[' + b",".join(head + body + b"}" for head, body in members) + b"]}"
