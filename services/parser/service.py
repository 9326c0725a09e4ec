"""The parser service: token stream in, event log out.

Each token partition has one durable pull consumer. For every fetched run of messages
the service applies them to the per-response states, commits the resulting events and
the consumed batches in one transaction, publishes the committed events for live tails,
and only then acks. A state it lacks (after a restart or takeover) is rebuilt by
replaying the batches already committed for that response."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from contextlib import suppress

import asyncpg
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from openai_harmony import HarmonyEncoding
from pydantic import ValidationError

from schemas.bus import GenerationEnded, TokenBatch, token_stream_message
from schemas.events import CommittedEvents
from services.common.bus import Names, durable_pull_config, ensure_streams
from services.parser.event_log import EventLog, ResponseWrite
from schemas.responses import ParseContext
from services.parser.response_state import OutOfOrder, ResponseState

log = logging.getLogger(__name__)

FETCH_BATCH = 256
MAX_DELIVER = 20
RETRY_DELAY_S = 0.5


class ParserService:
    def __init__(self, nc: Client, pool: asyncpg.Pool, names: Names, encoding: HarmonyEncoding) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._log = EventLog(pool)
        self._names = names
        self._encoding = encoding
        self._states: OrderedDict[str, ResponseState] = OrderedDict()

    async def run(self) -> None:
        await ensure_streams(self._js, self._names)
        await asyncio.gather(*(self._consume(p) for p in range(self._names.token_partitions)))

    async def _consume(self, partition: int) -> None:
        names = self._names
        durable = names.parser_consumer(partition)
        await self._js.add_consumer(
            names.tokens_stream,
            durable_pull_config(durable, names.tokens_partition_filter(partition), MAX_DELIVER, max_ack_pending=10_000),
        )
        subscription = await self._js.pull_subscribe_bind(durable, stream=names.tokens_stream)
        while True:
            try:
                messages = await subscription.fetch(FETCH_BATCH, timeout=1.0)
            except (NatsTimeoutError, asyncio.TimeoutError):
                continue
            except Exception:
                log.exception("fetching tokens failed; retrying")
                await asyncio.sleep(RETRY_DELAY_S)
                continue
            await self.process(messages)

    async def _state_for(self, response_id: str) -> ResponseState | None:
        state = self._states.get(response_id)
        if state is not None:
            return state
        record = await self._log.load_response(response_id)
        if record is None:
            return None
        state = ResponseState(
            response_id, record.base_snapshot, ParseContext.model_validate(record.parse_context), self._encoding
        )
        for message in await self._log.load_consumed(response_id):
            if isinstance(message, TokenBatch):
                state.apply_batch(message)
            else:
                state.apply_end(message)
        self._states[response_id] = state
        return state

    async def process(self, messages: list[Msg]) -> None:
        by_response: dict[str, list[tuple[Msg, TokenBatch | GenerationEnded]]] = {}
        for msg in messages:
            try:
                decoded = token_stream_message.validate_json(msg.data)
            except ValidationError:
                log.error("dropping an undecodable token message on %s", msg.subject)
                await msg.term()
                continue
            by_response.setdefault(decoded.response_id, []).append((msg, decoded))

        writes: list[ResponseWrite] = []
        to_ack: list[Msg] = []
        to_retry: list[Msg] = []
        for response_id, items in by_response.items():
            state = await self._state_for(response_id)
            if state is None:
                log.warning("tokens for unknown (deleted?) response %s dropped", response_id)
                to_ack += [msg for msg, _ in items]
                continue
            write = ResponseWrite(response_id)
            for position, (msg, decoded) in enumerate(items):
                try:
                    was_started = state.started
                    if isinstance(decoded, TokenBatch):
                        applied = state.apply_batch(decoded)
                    else:
                        applied = state.apply_end(decoded)
                except OutOfOrder as exc:
                    log.info("%s; retrying later", exc)
                    to_retry += [m for m, _ in items[position:]]
                    break
                except Exception:
                    log.exception("parsing %s failed; its state is dropped and rebuilt", response_id)
                    self._states.pop(response_id, None)
                    to_retry += [m for m, _ in items]
                    write = None
                    break
                to_ack.append(msg)
                if applied is None:
                    continue
                write.events += applied.events
                write.consumed.append(decoded)
                write.started = write.started or (state.started and not was_started)
                if applied.finished:
                    write.final_snapshot = state.final_snapshot
            if write is not None and (write.events or write.consumed):
                writes.append(write)

        try:
            if writes:
                await self._log.commit(writes)
        except Exception:
            log.exception("commit failed; %d messages will be redelivered", len(to_ack))
            for write in writes:
                self._states.pop(write.response_id, None)
            to_retry += to_ack
            to_ack = []
            writes = []

        for write in writes:
            if write.final_snapshot is not None:
                self._states.pop(write.response_id, None)
            if write.events:
                committed = CommittedEvents(response_id=write.response_id, events=write.events)
                with suppress(Exception):
                    await self._nc.publish(
                        self._names.events_subject(write.response_id), committed.model_dump_json().encode()
                    )
        for msg in to_ack:
            with suppress(Exception):
                await msg.ack()
        for msg in to_retry:
            with suppress(Exception):
                await msg.nak(delay=RETRY_DELAY_S)
