"""Messages held from delivery to their ack, kept from redelivery by one timer.

A JetStream consumer's ack wait is how long a dead holder's messages wait before
another holder gets them, so it is short (``ACK_WAIT_S``). A live holder keeps what it
holds by in-progress-acking every held message every ``BEAT_S``: one pass over all of
them rather than a task per message, four beats to an ack wait, so a process slowed
by a loaded machine keeps its messages while a dead one loses them within the ack wait.
A message acked within a beat of its delivery (the usual case) costs nothing more."""

from __future__ import annotations

from contextlib import suppress

from nats.aio.msg import Msg

BEAT_S = 0.3
ACK_WAIT_S = 4 * BEAT_S


class InProgress:
    def __init__(self) -> None:
        self._held: dict[int, Msg] = {}  # by id(): a Msg is not hashable

    def hold(self, msg: Msg) -> None:
        self._held[id(msg)] = msg

    def release(self, msg: Msg) -> None:
        self._held.pop(id(msg), None)

    def __len__(self) -> int:
        return len(self._held)

    async def beat(self) -> None:
        """In-progress-acks every message held now."""
        for msg in list(self._held.values()):
            with suppress(Exception):
                await msg.in_progress()
