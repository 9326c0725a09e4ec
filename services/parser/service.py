"""The parser service: token stream in, event log out.

Each token partition has one durable pull consumer; the partitions a parser holds are
read together, by one loop. For every run of messages that arrived (on any of them) the
service applies them to the per-response states, commits the resulting events and the
consumed batches in one transaction, publishes the committed events for live tails, and
only then acks. A state it lacks (after a restart or takeover) is rebuilt by replaying
the batches already committed for that response."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from contextlib import suppress
from dataclasses import dataclass

import asyncpg
from nats.aio.client import Client
from nats.aio.msg import Msg
from pydantic import ValidationError

from steno.schemas.bus import (
    ParserSeed,
    TokenBatch,
    TokenStreamMessage,
    stream_position,
    token_partition_message,
    unpacked,
)
from steno.schemas.ids import origin_of
from steno.schemas.responses import ParseContext
from steno.services.common import logs
from steno.services.common.bus import (
    Names,
    durable_pull_config,
    ensure_consumer,
    ensure_streams,
    follower_registry,
    message_limit,
    partition_of,
)
from steno.services.common.continuous_pull import Arrivals, ContinuousPull, deliveries
from steno.services.common.followers import Followers
from steno.services.common.in_progress import ACK_WAIT_S, InProgress
from steno.services.common.leases import PartitionLeases
from steno.services.common.metrics import PARSED_EVENTS, TOKENS_GIVEN_UP
from steno.services.common.model_files import ensure_model_files
from steno.services.common.reasoning_keys import ReasoningKeys
from steno.services.common.tracing import exporting, tenant_of, trace_context, tracer
from steno.services.parser.announcements import Announcements
from steno.services.parser.event_log import EventLog, ParserPools, ResponseWrite
from steno.services.parser.response_state import OutOfOrder, ResponseState

log = logging.getLogger(__name__)

FETCH_BATCH = 256
MAX_DELIVER = 20
# A batch handed back is redelivered after RETRY_DELAY_S, doubling with every further
# delivery up to MAX_RETRY_DELAY_S: a few quick retries, then patience.
RETRY_DELAY_S = 0.5
MAX_RETRY_DELAY_S = 8.0
# While Postgres is unreachable the messages stay held and are tried again in place
# (never handed back, so no delivery is spent on an outage), backing off to this: the
# partitions go on within about this long of its return, and a try costs little.
MAX_UNREACHABLE_WAIT_S = 1.0
# A batch that fails this many deliveries in a row fails its response.
POISON_DELIVERIES = 4
# A batch still ahead of everything Postgres holds for its response on this many
# deliveries follows one that is not coming: its response fails rather than waiting
# for good (the deliveries above come over about a minute).
STRANDED_DELIVERIES = 10
# A message on this, its last, delivery is not parsed: each parser it reached before
# stopped with it unsettled (killed by it, maybe), and JetStream delivers it no more,
# so its responses fail rather than stay in progress for good.
GIVEN_UP_MESSAGE = (f"A part of the model output was delivered to the parser {MAX_DELIVER} times, and each parser "
                    "that took it stopped before storing it; giving up.")
# States held in memory; a response silent long enough to fall out is rebuilt when it speaks.
MAX_STATES = 20_000
# A batch ahead of the one it follows is kept here, held, and tried again with whatever
# arrives next, rather than handed back: the one it follows is most often on its way (a
# dead parser's, back with the ack wait), and a batch handed back waits out a delay of
# its own (one that doubles with its deliveries) after that one has come. Kept for at
# most PARKED_S, then handed back as before; at most MAX_PARKED messages kept; tried
# again every PARKED_CHECK_S when nothing arrives.
PARKED_S = 3.0
MAX_PARKED = 512
PARKED_CHECK_S = 0.25


@dataclass(frozen=True)
class _Parked:
    msg: Msg
    pull: ContinuousPull
    since: float


class ParserService:
    def __init__(
        self, nc: Client, pools: ParserPools, names: Names, instance_id: str
    ) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._message_limit = message_limit(nc)
        self._log = EventLog(pools.planned, appends=pools.appends)
        self._names = names
        self._instance_id = instance_id
        self._states: OrderedDict[str, ResponseState] = OrderedDict()
        self._leases = PartitionLeases(nc, leases_bucket=names.parser_leases_bucket,
                                       holders_bucket=names.parsers_bucket, partitions=names.token_partitions,
                                       instance_id=instance_id, presence_prefix=names.presence_prefix,
                                       replicas=names.replicas)
        self._arrivals = Arrivals()
        self._pulls: dict[int, ContinuousPull] = {}
        # Partitions released while a run of their messages was being processed: the run
        # may have kept states of theirs, which go stale with the partition.
        self._released_meanwhile: set[int] = set()
        self._processing = False
        self._reasoning_keys = ReasoningKeys(pools.planned)
        # The parser acks within milliseconds of a delivery; what a dead parser had
        # fetched comes back to the partition's next holder within the ack wait, while
        # what waits here behind a slow commit is kept by in-progress acks.
        self._held = InProgress()
        self._followers = Followers()
        # Messages kept for a batch they follow (PARKED_S), by id(); and when each of
        # those being tried again was first kept.
        self._parked: dict[int, _Parked] = {}
        self._parked_since: dict[int, float] = {}

    async def run(self) -> None:
        await ensure_streams(self._js, self._names)
        await self._followers.start(await follower_registry(self._js, self._names), self._names.followers_bucket)
        for partition in range(self._names.token_partitions):
            await ensure_consumer(
                self._js,
                self._names.tokens_stream,
                durable_pull_config(
                    self._names.parser_consumer(partition),
                    self._names.tokens_partition_filter(partition),
                    MAX_DELIVER,
                    max_ack_pending=10_000,
                    ack_wait_s=ACK_WAIT_S,
                ),
            )
        log.info("parser %s ready", self._instance_id)
        beats = asyncio.create_task(self._held.keep())
        consuming = asyncio.create_task(self._consume())
        try:
            await self._leases.run(self._start_partition, self._stop_partition)
        finally:
            for task in (beats, consuming):
                task.cancel()
            await asyncio.gather(beats, consuming, return_exceptions=True)
            await self._followers.stop()

    async def stop(self) -> None:
        """Hands every partition back at once, so another parser need not wait for expiry."""
        await self._leases.release_all(self._stop_partition)

    async def _start_partition(self, partition: int) -> None:
        pull = ContinuousPull(self._nc, self._names.tokens_stream, self._names.parser_consumer(partition),
                              batch=FETCH_BATCH, held=self._held, arrivals=self._arrivals)
        await pull.start()
        self._pulls[partition] = pull

    async def _stop_partition(self, partition: int) -> None:
        pull = self._pulls.pop(partition, None)
        if pull is not None:
            with suppress(Exception):
                await pull.stop()
            for key, kept in list(self._parked.items()):
                if kept.pull is pull:  # to the partition's next holder at once
                    del self._parked[key]
                    with suppress(Exception):
                        await kept.msg.nak()
                    self._held.release(kept.msg)
        if self._processing:
            self._released_meanwhile.add(partition)
        self._forget_partition(partition)

    def _forget_partition(self, partition: int) -> None:
        # Another parser may write these responses now: what we know of them goes stale.
        for response_id in [r for r in self._states if partition_of(r, self._names.token_partitions) == partition]:
            del self._states[response_id]

    async def _consume(self) -> None:
        while True:
            try:
                arrived = await self._arrivals.next_messages(FETCH_BATCH, PARKED_CHECK_S if self._parked else None)
            except Exception:
                log.exception("receiving tokens failed; retrying")
                await asyncio.sleep(RETRY_DELAY_S)
                continue
            # What was kept is tried again with what arrived: the batch it follows, maybe.
            kept, self._parked = self._parked, {}
            self._parked_since = {key: parked.since for key, parked in kept.items()}
            arrived += [(parked.pull, parked.msg) for parked in kept.values()]
            messages = [msg for _, msg in arrived]
            self._processing = True
            try:
                await self._settle(arrived)
            except asyncio.CancelledError:
                # The parser is stopping: these go to the partitions' next holders at once, committed or not.
                for msg in [*messages, *(parked.msg for parked in self._parked.values())]:
                    with suppress(Exception):
                        await msg.nak()
                self._parked.clear()
                raise
            except Exception:
                log.exception("processing %d messages failed; they will be redelivered", len(messages))
                for msg in messages:
                    self._parked.pop(id(msg), None)
                    with suppress(Exception):
                        await msg.nak(delay=retry_delay(msg))
            finally:
                self._processing = False
                for msg in messages:
                    if id(msg) not in self._parked:
                        self._held.release(msg)
                for partition in self._released_meanwhile:
                    self._forget_partition(partition)
                self._released_meanwhile.clear()

    async def _settle(self, arrived: list[tuple[ContinuousPull, Msg]]) -> None:
        """Processes the messages until none is left for want of Postgres: those are kept
        (held, so not redelivered) and tried again, waiting longer each time, so an
        outage of any length delays the partitions without spending deliveries. Those of
        a partition released meanwhile go to its next holder instead."""
        pulls = {id(msg): pull for pull, msg in arrived}
        messages = [msg for _, msg in arrived]
        waited_s = 0.0
        wait_s = RETRY_DELAY_S / 2
        while messages:
            try:
                messages, parked = await self.process(messages)
            except Exception as exc:
                if not _unreachable(exc):
                    raise
                log.warning("Postgres is unreachable (%s); %d messages wait", exc, len(messages))
            else:
                await self._park(parked, pulls)
            if messages:
                await asyncio.sleep(wait_s)
                waited_s += wait_s
                wait_s = min(wait_s * 2, MAX_UNREACHABLE_WAIT_S)
                for msg in [msg for msg in messages if not pulls[id(msg)].receiving]:
                    with suppress(Exception):
                        await msg.nak()
                messages = [msg for msg in messages if pulls[id(msg)].receiving]
        if waited_s:
            log.info("Postgres answered again after %.1fs", waited_s)

    async def _park(self, parked: list[Msg], pulls: dict[int, ContinuousPull]) -> None:
        now = time.monotonic()
        for msg in parked:
            pull = pulls[id(msg)]
            if pull.receiving:
                self._parked[id(msg)] = _Parked(msg, pull, self._parked_since.get(id(msg), now))
            else:  # its partition went to another holder meanwhile
                with suppress(Exception):
                    await msg.nak()

    def _parkable(self, msgs: list[Msg], to_park: list[Msg]) -> bool:
        """Whether these messages may be kept (again) for the batch they follow."""
        now = time.monotonic()
        first_kept = min((self._parked_since.get(id(msg), now) for msg in msgs), default=now)
        return now - first_kept < PARKED_S and len(self._parked) + len(to_park) + len(msgs) <= MAX_PARKED

    async def _states_for(
        self, firsts: dict[str, tuple[Msg, TokenStreamMessage] | None]
    ) -> dict[str, ResponseState | None]:
        """The state of each response (by its first fetched message, if any): the one held,
        else one built from the seed on its very first batch, else one rebuilt from
        Postgres. Those rebuilt (after a restart or a takeover, a whole backlog of them)
        are read in one round trip. None for a response Postgres does not have."""
        states: dict[str, ResponseState | None] = {}
        to_read: list[str] = []
        for response_id, first in firsts.items():
            state = self._states.get(response_id)
            if state is not None:
                self._states.move_to_end(response_id)
            elif (seed := _fresh_seed(first) if first is not None else None) is not None:
                assert seed.chain_head is not None  # _fresh_seed takes no other
                state = await self._keep(response_id, seed.base_snapshot, seed.parse_context, [],
                                         bytes.fromhex(seed.chain_head))
            else:
                to_read.append(response_id)
            states[response_id] = state
        if to_read:
            records = await self._log.load_many(to_read)
            for response_id in to_read:
                record = records.get(response_id)
                if record is not None:
                    states[response_id] = await self._keep(response_id, record.base_snapshot,
                                                           record.parse_context, record.consumed, record.chain_head)
        return states

    async def _keep(self, response_id: str, base_snapshot: dict, parse_context: dict,
                    consumed: list[TokenStreamMessage], chain_head: bytes | None) -> ResponseState:
        context = ParseContext.model_validate(parse_context)
        if context.dialect_files is not None:
            await ensure_model_files(self._js, self._names, context.dialect_files)
        sealing = context.reasoning_sealing
        seal = await self._reasoning_keys.holding(sealing.key_id) if sealing is not None else None
        state = ResponseState(response_id, base_snapshot, context, seal=seal, chain_head=chain_head)
        for message in consumed:
            state.apply(message)
        self._states[response_id] = state
        if len(self._states) > MAX_STATES:
            # The least recently active; if it comes back it is rebuilt from Postgres.
            self._states.popitem(last=False)
        return state

    async def _fail_poisoned(self, response_id: str, write: ResponseWrite, exc: Exception) -> None:
        """Ends a response whose next batch keeps breaking the parser: failed, visibly,
        with the end recorded so a re-parse reaches the same failure."""
        await self._fail(response_id, write,
                         f"The model output could not be processed ({type(exc).__name__}); giving up.")

    async def _fail(self, response_id: str, write: ResponseWrite, message: str) -> None:
        """Adds to ``write`` the failure of the response where its stored stream stands."""
        state = (await self._states_for({response_id: None}))[response_id]
        if state is None or state.finished:
            return
        ended = state.failure(message)
        applied = state.apply_end(ended)
        if applied is not None:
            write.events += applied.events
            write.consumed += applied.recorded
            write.final_snapshot = state.final_snapshot

    async def process(self, messages: list[Msg]) -> tuple[list[Msg], list[Msg]]:
        """Applies, commits, announces and acks what it can of ``messages``, and hands back
        (nak) what must come again later; returns those it could not settle for want of
        Postgres, and those to keep for a batch they follow (``PARKED_S``), both still held."""
        fetched_ns = time.time_ns()
        by_response: dict[str, list[tuple[Msg, TokenStreamMessage]]] = {}
        # The headers of each message a group carried (trace context, tenant).
        carried: dict[tuple[int, str], dict[str, str] | None] = {}
        for msg in messages:
            try:
                unpacked_messages = unpacked(token_partition_message.validate_json(msg.data), msg.headers)
            except ValidationError:
                log.error("dropping an undecodable token message on %s", msg.subject)
                await msg.term()
                continue
            for decoded, headers in unpacked_messages:
                by_response.setdefault(decoded.response_id, []).append((msg, decoded))
                carried[id(msg), decoded.response_id] = headers
        for items in by_response.values() if self._parked_since else ():
            if any(id(msg) in self._parked_since for msg, _ in items):
                # Kept batches come after what arrived since (the batch they follow, maybe).
                items.sort(key=lambda item: stream_position(item[1]))

        writes: list[ResponseWrite] = []
        to_ack: list[Msg] = []
        to_retry: list[Msg] = []
        to_park: list[Msg] = []
        # The messages that go with each write: acked once it is committed.
        written: dict[str, list[Msg]] = {}
        # Responses failed at a message's last delivery (GIVEN_UP_MESSAGE).
        given_up: set[str] = set()
        try:
            states = await self._states_for({response_id: items[0] for response_id, items in by_response.items()})
            for response_id, items in by_response.items():
                state = states[response_id]
                if state is None:
                    log.warning("tokens for unknown (deleted?) response %s dropped", response_id)
                    to_ack += [msg for msg, _ in items]
                    continue
                write = ResponseWrite(response_id)
                for position, (msg, decoded) in enumerate(items):
                    if deliveries(msg) >= MAX_DELIVER and not state.has_applied(decoded):
                        log.error("a token message of %s on its last delivery, unsettled by every parser before: "
                                  "the response fails", response_id)
                        await self._fail(response_id, write, GIVEN_UP_MESSAGE)
                        given_up.add(response_id)
                        # Acked once the failure is committed, as applied messages are.
                        written.setdefault(response_id, []).extend(m for m, _ in items[position:])
                        break
                    was_started = state.started
                    try:
                        applied = state.apply(decoded)
                    except OutOfOrder as exc:
                        ahead = [m for m, _ in items[position:]]
                        kept_before = any(id(m) in self._parked_since for m in ahead)
                        parking = self._parkable(ahead, to_park)
                        if not (kept_before and parking):
                            # What it lacks may have been committed by another writer (a
                            # parser that held the partition until it noticed it had lost
                            # it): the next try rebuilds the state from Postgres, or it
                            # would wait for batches that never come back to it.
                            self._states.pop(response_id, None)
                        if position == 0 and deliveries(msg) >= STRANDED_DELIVERIES:
                            log.error("%s, on delivery %d: the response fails", exc, deliveries(msg))
                            await self._fail(response_id, write, "The model output is incomplete: a part of it"
                                             " never reached the parser; giving up.")
                            to_ack += [m for m, _ in items]
                        elif parking:
                            if not kept_before:
                                log.info("%s; kept until it comes", exc)
                            to_park += ahead
                        else:
                            log.info("%s; retrying later", exc)
                            to_retry += ahead
                        break
                    except Exception as exc:
                        log.exception("parsing %s failed; its state is dropped and rebuilt", response_id)
                        self._states.pop(response_id, None)
                        if position == 0 and deliveries(msg) >= POISON_DELIVERIES:
                            await self._fail_poisoned(response_id, write, exc)
                            to_ack += [m for m, _ in items]
                        else:
                            to_retry += [m for m, _ in items[position:]]
                        break
                    written.setdefault(response_id, []).append(msg)
                    if applied is None:
                        continue
                    write.events += applied.events
                    write.consumed += applied.recorded
                    write.started = write.started or (state.started and not was_started)
                    if applied.finished:
                        write.final_snapshot = state.final_snapshot
                if write.events or write.consumed:
                    writes.append(write)
                else:
                    to_ack += written.pop(response_id, [])
        except Exception:
            # States advanced here have not been committed: forget them, or the redelivered
            # batches would pass for duplicates and their events would never be written.
            for response_id in by_response:
                self._states.pop(response_id, None)
            raise

        committed, failed = await self._commit(writes)
        unsettled: list[Msg] = []
        for write in failed:
            unsettled += written.pop(write.response_id, [])
        # Counted per model and commit: a labelled counter's lookup (a lock and a dict)
        # per response would come on every step of every long stream.
        parsed_by_model: dict[str, int] = {}
        announcing = Announcements(self._message_limit)
        for write in committed:
            delivered = written.pop(write.response_id, [])
            to_ack += delivered
            _trace_commit(write, carried.get((id(delivered[0]), write.response_id)) if delivered else None,
                          fetched_ns)
            if (state := states.get(write.response_id)) is not None:
                parsed_by_model[state.model] = parsed_by_model.get(state.model, 0) + len(write.events)
                if write.response_id in given_up and write.final_snapshot is not None:
                    TOKENS_GIVEN_UP.labels(state.model).inc()
            if write.final_snapshot is not None:
                self._states.pop(write.response_id, None)
            announcing.add(write.response_id, write.events,
                           [origin_of(write.response_id), *self._followers.of(write.response_id)])
        for origin, announcement in announcing.messages():
            with suppress(Exception):
                await self._nc.publish(self._names.events_subject(origin), announcement)
        for model, count in parsed_by_model.items():
            PARSED_EVENTS.labels(model).inc(count)
        # A group settles as its least settled batch: held while any waits for Postgres,
        # else handed back while any must come again (those applied come as duplicates),
        # else kept while any waits here for the batch it follows.
        held = {id(msg) for msg in unsettled}
        retried = {id(msg): msg for msg in to_retry if id(msg) not in held}
        parked = {id(msg): msg for msg in to_park if id(msg) not in held and id(msg) not in retried}
        acked = {id(msg): msg for msg in to_ack if id(msg) not in held and id(msg) not in retried
                 and id(msg) not in parked}
        for msg in acked.values():
            with suppress(Exception):
                await msg.ack()
        for msg in retried.values():
            with suppress(Exception):
                await msg.nak(delay=retry_delay(msg))
        for write in committed:
            if write.final_snapshot is not None and not write.final_snapshot.get("store", True):
                await self._forget_tokens(write.response_id)
        return list({id(msg): msg for msg in unsettled}.values()), list(parked.values())

    async def _commit(self, writes: list[ResponseWrite]) -> tuple[list[ResponseWrite], list[ResponseWrite]]:
        """Commits the writes; returns those committed (or replaced by their response's
        failure) and those to retry. A write that Postgres refuses for what it holds, not
        for being unreachable, is tried alone, so that it cannot hold up its partition's
        other responses; refused alone too, its response fails visibly instead."""
        if not writes:
            return [], []
        try:
            await self._log.commit(writes)
            return writes, []
        except Exception as exc:
            for write in writes:
                self._states.pop(write.response_id, None)
            if _unreachable(exc):
                log.warning("commit failed (%s); %d responses will be retried", exc, len(writes))
                return [], writes
            log.exception("commit of %d responses refused; trying each alone", len(writes))
        committed: list[ResponseWrite] = []
        failed: list[ResponseWrite] = []
        for write in writes:
            try:
                await self._log.commit([write])
                committed.append(write)
                continue
            except Exception as exc:
                self._states.pop(write.response_id, None)
                if _unreachable(exc):
                    failed.append(write)
                    continue
                log.exception("the write of %s is refused; the response fails", write.response_id)
                refusal = exc
            ending = ResponseWrite(write.response_id)
            try:
                await self._fail_poisoned(write.response_id, ending, refusal)
                if ending.events or ending.consumed:
                    await self._log.commit([ending])
            except Exception:
                log.exception("recording the failure of %s failed; it will be retried", write.response_id)
                self._states.pop(write.response_id, None)
                failed.append(write)
                continue
            committed.append(ending)
        return committed, failed

    async def _forget_tokens(self, response_id: str) -> None:
        """A response not to be stored leaves no output on the bus once it has ended."""
        try:
            await self._js.purge_stream(self._names.tokens_stream, subject=self._names.tokens_subject(response_id))
        except Exception:
            log.warning("could not purge the token stream of %s (it expires with the stream's age limit)",
                        response_id, exc_info=True)


def retry_delay(msg: Msg) -> float:
    """How long a message handed back waits before its next delivery."""
    return min(RETRY_DELAY_S * 2 ** max(0, deliveries(msg) - 2), MAX_RETRY_DELAY_S)


def _unreachable(exc: BaseException) -> bool:
    """Whether a commit failed for want of Postgres (retry all) rather than for what it
    held (isolate it)."""
    if isinstance(exc, ValueError):  # asyncpg's refusal to encode an argument is an InterfaceError too
        return False
    return isinstance(exc, (OSError, TimeoutError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
                            asyncpg.CannotConnectNowError, asyncpg.TooManyConnectionsError,
                            asyncpg.SerializationError, asyncpg.DeadlockDetectedError))


def _fresh_seed(first: tuple[Msg, TokenStreamMessage]) -> ParserSeed | None:
    """The seed of a response's first batch, delivered for the first time: nothing of
    the response can have been consumed before it (a partition's first deliveries come
    in stream order), so the seed is the whole state. A redelivery may follow a commit;
    that state comes from Postgres, and so does one whose seed lacks the hash its events
    chain from (made by an API that predates the chain)."""
    msg, decoded = first
    if (isinstance(decoded, TokenBatch) and decoded.parser_seed is not None and decoded.attempt == 0
            and decoded.batch_no == 0 and deliveries(msg) == 1
            and decoded.parser_seed.chain_head is not None):
        return decoded.parser_seed
    return None


def _trace_commit(write: ResponseWrite, headers: dict[str, str] | None, fetched_ns: int) -> None:
    """A span for what one commit wrote of a response, from the fetch, in the trace its
    batches carry (one per commit, not per batch); the commit of its end logs that it
    finished. Without an exporter only the end is worth the span and log context."""
    final = write.final_snapshot
    if final is None and not exporting():
        return
    with (tracer.start_as_current_span("parse", context=trace_context(headers), start_time=fetched_ns,
                                       attributes={"steno.response_id": write.response_id,
                                                   "steno.events": len(write.events)}),
          logs.response_context(response_id=write.response_id, tenant=tenant_of(headers),
                                attempt=write.consumed[-1].attempt if write.consumed else None,
                                model=final.get("model") if final is not None else None)):
        if final is not None:
            usage = final.get("usage") or {}
            created_at, completed_at = final.get("created_at"), final.get("completed_at")
            log.info("response finished", extra={
                "status": final.get("status"), "output_tokens": usage.get("output_tokens"),
                "duration_s": completed_at - created_at if created_at and completed_at else None})
