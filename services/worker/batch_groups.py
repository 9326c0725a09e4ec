"""Token batches that are ready at the same moment go to JetStream together: one
``TokenBatchGroup`` per token partition instead of one message per response.

An engine's step makes a token for every running request at once, so every stream's
batch is flushed within the same turn of the event loop; each message costs the worker,
NATS and the parser about the same whatever it carries (a store, an acknowledgement,
a delivery and an ack), so one message per partition and step costs a fraction of one
per response. A batch waits for nothing it would not have waited for alone: the group
goes out at the end of the turn in which its first batch came, and every caller
returns once the group is stored, as after a publish of its own."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import orjson

from steno.services.common.bus import Names, partition_of
from steno.services.common.stored_publish import StoredPublisher

# A group's body stays this far under the bus's message limit (the envelope of each
# batch, and a margin for headers).
ENVELOPE_BYTES = 256


@dataclass
class _Grouped:
    response_id: str
    body: bytes
    headers: dict[str, str]
    msg_id: str
    stored: asyncio.Future[None]


@dataclass
class _Forming:
    batches: list[_Grouped] = field(default_factory=list)
    size: int = 0


class BatchGroups:
    """``publish`` stores a batch, in a group with the other batches of its partition
    published in the same turn of the event loop; a batch that finds no company goes
    as a message of its own, on its response's subject."""

    def __init__(self, publisher: StoredPublisher, names: Names, message_limit: int) -> None:
        self._publisher = publisher
        self._names = names
        self._limit = message_limit
        self._forming: dict[int, _Forming] = {}
        self._sending = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def publish(self, response_id: str, body: bytes, headers: dict[str, str], msg_id: str) -> None:
        """Returns once the batch is stored, alone or in a group; raises as
        ``StoredPublisher.publish`` does when it is not (the caller retries it alone)."""
        loop = asyncio.get_running_loop()
        grouped = _Grouped(response_id, body, headers, msg_id, loop.create_future())
        partition = partition_of(response_id, self._names.token_partitions)
        forming = self._forming.setdefault(partition, _Forming())
        added = len(body) + ENVELOPE_BYTES + sum(len(k) + len(v) for k, v in headers.items())
        if forming.batches and forming.size + added > self._limit:
            self._send(partition, self._forming.pop(partition))
            forming = self._forming.setdefault(partition, _Forming())
        forming.batches.append(grouped)
        forming.size += added
        if not self._sending:
            self._sending = True
            loop.call_soon(self._send_forming)
        await grouped.stored

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
                                              alone.headers)
            else:
                body = group_body([(grouped.body, grouped.headers) for grouped in batches])
                await self._publisher.publish(self._names.tokens_group_subject(partition), body,
                                              {"Nats-Msg-Id": f"group:{batches[0].msg_id}"})
        except Exception as exc:
            for grouped in batches:
                if not grouped.stored.done():
                    grouped.stored.set_exception(exc)
            return
        for grouped in batches:
            if not grouped.stored.done():
                grouped.stored.set_result(None)


def group_body(batches: list[tuple[bytes, dict[str, str]]]) -> bytes:
    """A ``TokenBatchGroup`` of batches already encoded, each with its headers: spliced,
    not encoded again."""
    members = b",".join(b'{"headers":' + orjson.dumps(_carried(headers)) + b',"batch":' + body + b"}"
                        for body, headers in batches)
    return b'{"kind":"group","v":1,"batches":[' + members + b"]}"


def _carried(headers: dict[str, str]) -> dict[str, str]:
    """A batch's headers but its message id, which names a message of its own."""
    return {name: value for name, value in headers.items() if name != "Nats-Msg-Id"}
