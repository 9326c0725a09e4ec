"""Pulls generation requests for one model and streams the engine's tokens onto the bus.

Every worker of a model pulls the model's shared queue. Requests with a
``prompt_cache_key`` go to one of the model's affinity shards instead, and each shard is
pulled by the one worker holding its lease, so a conversation keeps meeting the engine
that has its prefix cached; a worker that dies or leaves hands its shards on within the
lease's expiry, and what waited on them stays in JetStream for the next holder.

Backpressure: the worker asks JetStream for no more requests than it has free slots
(of ``concurrency``), so waiting work stays in JetStream, never in worker memory. The
shards it holds pull one request at a time from the same slots, so at most one request
per shard held can start beyond ``concurrency``. While a request
is held the worker heartbeats it (in-progress acks); it acks only after the last batch,
which carries the attempt's end, is stored in the TOKENS stream, so a worker that dies
mid-generation has its request redelivered. The delivery count is the attempt number; a later
attempt records its takeover (the takeovers bucket), reads what earlier ones published and
continues from there, and a worker still generating an earlier attempt (frozen past its ack
wait, then thawed) stops it when it hears of the takeover."""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from contextlib import suppress
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.errors import NotFoundError, ObjectNotFoundError
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from pydantic import ValidationError

from steno.schemas.bus import (
    ChatTemplateFiles,
    FinishReason,
    GenerationEnded,
    GenerationRequest,
    GenerationWork,
    MaxDeliveriesAdvisory,
    QueueCheck,
    StoredGenerationRequest,
    Takeover,
    TokenBatch,
    WorkerRegistration,
    generation_work,
    token_batch_json,
)
from steno.services.common import logs
from steno.services.common.bus import (
    CANCEL_FLAG_TTL_S,
    TAKEOVER_TTL_S,
    WORK_DUPLICATE_WINDOW_S,
    WORKER_REGISTRATION_EVERY_S,
    Names,
    cancel_flags,
    durable_pull_config,
    ensure_consumer,
    ensure_streams,
    message_limit,
    model_token,
    patiently,
    request_store,
    takeover_records,
    worker_registry,
)
from steno.services.common.continuous_pull import ContinuousPull, Credits, deliveries
from steno.services.common.in_progress import ACK_WAIT_S, InProgress
from steno.services.common.kv_mirror import KvMirror
from steno.services.common.leases import PartitionLeases
from steno.services.common.metrics import (
    BATCH_WINDOW,
    FREE_SLOTS,
    GENERATED_TOKENS,
    GENERATIONS,
    IN_FLIGHT,
    PROMPT_TOKENS,
    WORK_EXHAUSTED,
    WORK_REDELIVERED,
    WORK_UNQUEUED,
)
from steno.services.common.model_files import publish_model_files
from steno.services.common.stored_publish import StoredPublisher
from steno.services.common.tracing import context_headers, message_headers, tenant_of, trace_context, tracer
from steno.services.worker.batch_groups import BatchGroups, Carried
from steno.services.worker.engine import Engine, EngineError
from steno.services.worker.prior_output import PriorOutput, read_prior_output
from steno.services.worker.token_batcher import CoalescingWindow, PendingBatch, coalesce

log = logging.getLogger(__name__)

# A request that keeps failing before its end is published (bus trouble, a crash loop)
# is given up after this many deliveries.
MAX_DELIVER = 5
# The running requests' cancel flags are also read directly this often, in case the
# watcher missed one (cut off from NATS, say), this many reads at a time.
CANCEL_CHECK_S = 3.0
CANCEL_READS_AT_ONCE = 32
# Publishing rides out a NATS restart this long before the attempt is abandoned.
PUBLISH_PATIENCE_S = 60.0
RETRY_DELAY_S = 0.5
# Advisories of exhausted requests taken at a time; they are rare.
EXHAUSTED_BATCH = 16
UNQUEUED = ("The response was stored, but the API process that stored it stopped before queuing its "
            "generation; create it again.")


@dataclass
class _AttemptOutput:
    """What an attempt has published so far: its batches, and the output tokens with
    those of the attempts before it (once read)."""

    batches: int = 0
    tokens: int = 0
    # The later attempt that took the response over while this one ran.
    superseded_by: int | None = None


class GenerationWorker:
    def __init__(
        self,
        nc: Client,
        names: Names,
        model: str,
        engine: Engine,
        *,
        dialect: str,
        instance_id: str,
        dialect_files: ChatTemplateFiles | None = None,
        concurrency: int = 64,
        batch_interval_s: float = 0.005,
        batch_max_tokens: int = 64,
        keepalive_s: float = 15.0,
    ) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._publisher = StoredPublisher(nc)
        self._groups = BatchGroups(self._publisher, names, message_limit(nc), alone=self._publish)
        self._names = names
        self._model = model
        self._engine = engine
        self._dialect_files = dialect_files
        self._registration = WorkerRegistration(model=model, engine=engine.name, dialect=dialect,
                                                context_tokens=engine.context_tokens, created=int(time.time()),
                                                dialect_files=dialect_files.digest() if dialect_files else None)
        self._concurrency = concurrency
        self._credits = Credits(concurrency)
        # Every work message delivered here and not yet acked or handed back: a dead
        # worker's requests go on elsewhere within the ack wait.
        self._held = InProgress()
        self._feed = ContinuousPull(nc, names.gen_stream, names.worker_consumer(model), batch=concurrency,
                                    credits=self._credits, held=self._held)
        # Requests of any model that JetStream will deliver no more, as its advisories tell.
        self._exhausted = ContinuousPull(nc, names.exhausted_work_stream, names.exhausted_work_consumer,
                                         batch=EXHAUSTED_BATCH)
        self._leases = PartitionLeases(nc, leases_bucket=names.affinity_leases_bucket,
                                       holders_bucket=names.affinity_holders_bucket,
                                       partitions=names.affinity_shards, instance_id=instance_id,
                                       presence_prefix=names.presence_prefix, replicas=names.replicas,
                                       scope=model_token(model))
        self._shard_pulls: dict[int, asyncio.Task] = {}
        self._lease_rounds: asyncio.Task | None = None
        self._heartbeats: asyncio.Task | None = None
        # Shared by every stream here: it widens while most of this worker's batches wait for it.
        self._window = CoalescingWindow(batch_interval_s)
        self._batch_max_tokens = batch_max_tokens
        self._keepalive_s = keepalive_s
        self._tasks: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()
        # The attempts generating here now, by response id and attempt (two attempts of a
        # response meet on a worker whose stop outlasted the ack wait).
        self._running: dict[str, dict[int, _AttemptOutput]] = {}
        # Levels read when scraped; the counters' children are bound once, off the token path.
        IN_FLIGHT.labels(model).set_function(lambda: len(self._tasks))
        FREE_SLOTS.labels(model).set_function(lambda: max(0, self._credits.count))
        BATCH_WINDOW.labels(model).set_function(lambda: self._window.window_s)
        self._tokens_published = GENERATED_TOKENS.labels(model)

    async def run(self) -> None:
        names = self._names
        await ensure_streams(self._js, names)
        await self._publisher.start()
        if self._dialect_files is not None:
            files = self._dialect_files
            await patiently(lambda: publish_model_files(self._js, names, files), "publishing the model's files")
        durable = names.worker_consumer(self._model)
        await ensure_consumer(
            self._js,
            names.gen_stream,
            durable_pull_config(
                durable, names.gen_subject(self._model), MAX_DELIVER, max_ack_pending=10_000, ack_wait_s=ACK_WAIT_S
            ),
        )
        await ensure_consumer(
            self._js,
            names.exhausted_work_stream,
            # Handled again (after the ack wait) for as long as its handling fails.
            durable_pull_config(names.exhausted_work_consumer, names.exhausted_work_advisories(), max_deliver=-1,
                                max_ack_pending=10_000),
        )
        self._requests = await request_store(self._js, names)
        await self._exhausted.start()
        exhausted = asyncio.create_task(self._end_exhausted_requests())
        await self._feed.start()
        self._lease_rounds = asyncio.create_task(self._leases.run(self._start_shard, self._stop_shard))
        # Every cancel order reaches every worker through this one watcher: a request not
        # started yet is ended at once when it comes, one generating here is aborted.
        self._cancels = KvMirror(await cancel_flags(self._js, names), names.cancel_bucket, CANCEL_FLAG_TTL_S,
                                 on_put=self._on_cancel)
        await self._cancels.start()
        self._takeover_records = await takeover_records(self._js, names)
        self._takeovers = KvMirror(self._takeover_records, names.takeovers_bucket, TAKEOVER_TTL_S,
                                   on_put=self._on_takeover)
        await self._takeovers.start()
        registration = asyncio.create_task(self._register())
        cancel_checks = asyncio.create_task(self._check_cancels())
        # Keeps every request held here ours, from its delivery (reading the request and
        # the earlier attempts' output included) to its ack; beats on while stop() drains
        # the requests still running.
        self._heartbeats = asyncio.create_task(self._held.keep())
        log.info("worker for model %s (engine %s) ready", self._model, self._engine.name)
        try:
            await self._take_work(self._feed)
        finally:
            registration.cancel()
            cancel_checks.cancel()
            exhausted.cancel()
            await self._exhausted.stop()
            await self._feed.stop()
            await self._hand_shards_on()
            await self._cancels.stop()
            await self._takeovers.stop()

    async def stop(self, drain_timeout_s: float) -> None:
        """Stops taking work and waits for what is in flight, at most ``drain_timeout_s``;
        what is still running then is handed back for another worker to continue."""
        self._stopping.set()
        await self._feed.stop()  # what was delivered but not started goes back at once
        await self._hand_shards_on()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=drain_timeout_s)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            await asyncio.gather(self._heartbeats, return_exceptions=True)
        await self._publisher.stop()

    async def _register(self) -> None:
        """Tells the API this model is served, and in which dialect, for as long as the
        worker runs."""
        registry = await worker_registry(self._js, self._names)
        while True:
            with suppress(Exception):
                await registry.put(model_token(self._model), self._registration.model_dump_json().encode())
            await asyncio.sleep(WORKER_REGISTRATION_EVERY_S)

    async def _on_cancel(self, response_id: str, _: bytes) -> None:
        for attempt in list(self._running.get(response_id, ())):
            await self._engine.abort(engine_request_id(response_id, attempt))

    async def _on_takeover(self, response_id: str, value: bytes) -> None:
        """Stops the attempts of the response generating here before the one that took it
        over: what they publish from now on is dropped by the parser, and their ack would
        settle the later attempt's delivery too."""
        try:
            taken = Takeover.model_validate_json(value)
        except ValidationError:
            log.warning("an unreadable takeover of %s is ignored", response_id)
            return
        for attempt, out in list(self._running.get(response_id, {}).items()):
            if attempt < taken.attempt and out.superseded_by is None:
                out.superseded_by = taken.attempt
                await self._engine.abort(engine_request_id(response_id, attempt))

    async def _hand_shards_on(self) -> None:
        """Stops pulling the affinity shards and frees their leases for the other workers
        at once, instead of at the leases' expiry."""
        if self._lease_rounds is not None:
            self._lease_rounds.cancel()
            await asyncio.gather(self._lease_rounds, return_exceptions=True)
        await self._leases.release_all(self._stop_shard)

    async def _start_shard(self, shard: int) -> None:
        self._shard_pulls[shard] = asyncio.create_task(self._pull_shard(shard))

    async def _stop_shard(self, shard: int) -> None:
        task = self._shard_pulls.pop(shard, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _pull_shard(self, shard: int) -> None:
        """Takes the shard's requests for as long as this worker holds its lease."""
        names = self._names
        durable = names.affinity_consumer(self._model, shard)
        feed = ContinuousPull(self._nc, names.gen_stream, durable, batch=1, credits=self._credits, held=self._held)
        while True:
            try:
                # Not ensure_consumer: this loop asks again for as long as the lease is held.
                await self._js.add_consumer(names.gen_stream, durable_pull_config(
                    durable, names.gen_affinity_subject(self._model, shard), MAX_DELIVER, max_ack_pending=10_000,
                    ack_wait_s=ACK_WAIT_S))
                await feed.start()
                break
            except Exception:
                log.exception("starting to pull affinity shard %d failed; retrying", shard)
                await asyncio.sleep(RETRY_DELAY_S)
        try:
            await self._take_work(feed)
        finally:
            await feed.stop()

    async def _take_work(self, feed: ContinuousPull) -> None:
        """Starts each request as it is delivered; the feed asks for no more than there
        are free slots, so a burst arrives in one round trip and nothing waits here."""
        while not self._stopping.is_set():
            try:
                messages = await feed.next_messages(self._concurrency)
            except Exception:
                log.exception("receiving work failed; retrying")
                await asyncio.sleep(RETRY_DELAY_S)
                continue
            for msg in messages:
                task = asyncio.create_task(self._run_one(msg))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _run_one(self, msg: Msg) -> None:
        # Each request runs in a task of its own, whose log context and trace it joins.
        logs.bind(tenant=tenant_of(msg.headers), model=self._model)
        try:
            with tracer.start_as_current_span("generate", context=trace_context(msg.headers), kind=SpanKind.CONSUMER,
                                              attributes={"steno.model": self._model}):
                await self._generate(msg)
        except asyncio.CancelledError:
            # Shutting down: hand the request back at once; the next attempt continues it.
            with suppress(Exception):
                await msg.nak()
            raise
        except Exception:
            log.exception("generation failed on the bus; the request will be redelivered")
            with suppress(Exception):
                await msg.nak(delay=1.0)
        finally:
            self._held.release(msg)
            self._credits.release()

    async def _check_cancels(self) -> None:
        """Reads the running requests' cancel flags directly every ``CANCEL_CHECK_S``,
        several at a time, and aborts those whose flag the watcher missed."""
        while True:
            await asyncio.sleep(CANCEL_CHECK_S)
            running = list(self._running)
            for start in range(0, len(running), CANCEL_READS_AT_ONCE):
                await asyncio.gather(*(self._abort_if_cancelled(response_id)
                                       for response_id in running[start:start + CANCEL_READS_AT_ONCE]))

    async def _abort_if_cancelled(self, response_id: str) -> None:
        with suppress(Exception):
            if (order := await self._cancels.fetch(response_id)) is not None:
                await self._on_cancel(response_id, order)

    async def _record_takeover(self, response_id: str, attempt: int) -> None:
        try:
            await self._takeover_records.put(
                response_id, Takeover(response_id=response_id, attempt=attempt).model_dump_json().encode())
        except Exception:
            log.warning("%s attempt %d: its takeover could not be recorded; an earlier attempt still running goes on "
                        "to its end", response_id, attempt, exc_info=True)

    async def _publish(self, subject: str, body: bytes, msg_id: str, context: dict[str, str] | None = None) -> None:
        """Publishes to JetStream, riding out a NATS restart; the message id makes a
        retried publish harmless. ``context``: as ``message_headers`` takes it."""
        deadline = time.monotonic() + PUBLISH_PATIENCE_S
        delay = 0.05
        while True:
            try:
                await self._publisher.publish(subject, body, message_headers(msg_id, context))
                return
            except Exception:
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _give_up(self, response_id: str, attempt: int, out: _AttemptOutput, prompt_tokens: int,
                       exc: Exception) -> None:
        """Ends the response with an error at this attempt's next position, where the
        parser applies it whatever the earlier attempts published."""
        await self._end_with_error(response_id, attempt, out.batches, prompt_tokens, out.tokens,
                                   f"The generation failed on every delivery ({type(exc).__name__}).")

    async def _end_with_error(self, response_id: str, attempt: int, batch_count: int, prompt_tokens: int,
                              output_tokens: int, message: str) -> None:
        """Publishes the response's end, an error, at ``attempt``'s ``batch_count``."""
        ended = GenerationEnded(response_id=response_id, attempt=attempt, batch_count=batch_count,
                                finish_reason="error", prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                                error_code="server_error", error_message=message, completed_at=int(time.time()))
        await self._publish(self._names.tokens_subject(response_id), ended.model_dump_json().encode(),
                            f"{response_id}:{attempt}:{batch_count}")

    async def _end_exhausted_requests(self) -> None:
        """Ends each request that JetStream will deliver no more: every worker that took
        it stopped with it before its end (died, froze, or was crashed by the request
        itself), so none could give it up. Whichever worker takes the advisory ends the
        response visibly (the end's message id makes a repeat a duplicate) and takes the
        request off the queue; an advisory is acked only then, so one whose worker dies
        meanwhile goes to another."""
        while True:
            try:
                advisories = await self._exhausted.next_messages(EXHAUSTED_BATCH)
            except Exception:
                log.exception("receiving exhausted requests failed; retrying")
                await asyncio.sleep(RETRY_DELAY_S)
                continue
            for advisory in advisories:
                try:
                    await self._on_exhausted(advisory)
                except Exception:
                    log.exception("ending a request that ran out of deliveries failed; it is tried again after "
                                  "the ack wait")

    async def _on_exhausted(self, advisory: Msg) -> None:
        seq = MaxDeliveriesAdvisory.model_validate_json(advisory.data).stream_seq
        # Each step is safe to repeat.
        await patiently(lambda: self._end_exhausted(seq), "ending a request that ran out of deliveries")
        await advisory.ack()

    async def _end_exhausted(self, seq: int) -> None:
        try:
            stored = await self._js.get_msg(self._names.gen_stream, seq)
        except NotFoundError:
            return  # acked after all, or ended by another worker
        work = generation_work.validate_json(stored.data or b"")
        rid = work.response_id
        with logs.response_context(response_id=rid, tenant=tenant_of(stored.headers), model=work.model):
            prior = await read_prior_output(self._js, self._names, rid, since=stored.time)
            if not prior.ended:
                # An attempt number no delivery gives a worker: it comes after all of theirs.
                await self._end_with_error(
                    rid, MAX_DELIVER, 0, await self._prompt_tokens(work), len(prior.token_ids),
                    f"The generation was taken up {MAX_DELIVER} times, and each worker that took it stopped "
                    "before its end; giving up.")
            try:
                await self._js.delete_msg(self._names.gen_stream, seq)
            except NotFoundError:
                return  # another worker took it off first
            if not prior.ended:
                WORK_EXHAUSTED.labels(work.model).inc()
                log.error("%s ran out of deliveries with no end published; the response fails", rid)

    async def _prompt_tokens(self, work: GenerationWork) -> int:
        """The request's prompt length, for the failed response's usage (0 where a stored
        request is gone)."""
        if isinstance(work, GenerationRequest):
            return len(work.prompt_token_ids)
        if isinstance(work, QueueCheck):
            return 0
        with suppress(ObjectNotFoundError):
            return len((await self._stored_request(work)).prompt_token_ids)
        return 0

    async def _stored_request(self, work: StoredGenerationRequest) -> GenerationRequest:
        """The request a work message names in the request store (ObjectNotFoundError when gone)."""
        return GenerationRequest.model_validate_json((await self._requests.get(work.name)).data or b"")

    async def _request_of(self, work: StoredGenerationRequest, msg: Msg, attempt: int) -> GenerationRequest | None:
        """The request a work message names in the request store; None (its response
        failed visibly) when it is gone."""
        try:
            return await self._stored_request(work)
        except ObjectNotFoundError:
            ended = GenerationEnded(response_id=work.response_id, attempt=attempt, batch_count=1,
                                    finish_reason="error", prompt_tokens=0, output_tokens=0,
                                    error_code="server_error",
                                    error_message="The generation request expired before a worker could take it.",
                                    completed_at=int(time.time()))
            batch = TokenBatch(response_id=work.response_id, attempt=attempt, batch_no=0, token_ids=[], ended=ended)
            await self._publish(self._names.tokens_subject(work.response_id), batch.model_dump_json().encode(),
                                f"{work.response_id}:{attempt}:0")
            await msg.ack()
            return None

    async def _end_unqueued(self, check: QueueCheck, msg: Msg) -> None:
        """A check JetStream kept: the response's work never reached the queue, so nothing
        else will end it. Its end is the response's only token message (attempt 0, batch
        0, whichever delivery this is: a repeat is a duplicate). Unless output was
        published for it after all: a NATS restart forgets the message ids of work
        already done and gone from the queue, whose responses a lagging parser may not
        have marked in progress yet."""
        rid = check.response_id
        logs.bind(response_id=rid)
        since = msg.metadata.timestamp - datetime.timedelta(seconds=WORK_DUPLICATE_WINDOW_S)
        prior = await read_prior_output(self._js, self._names, rid, since=since)
        if prior.ended or prior.token_ids:
            log.info("%s: its work was queued after all; the check is dropped", rid)
        else:
            await self._end_with_error(rid, 0, 0, 0, 0, UNQUEUED)
            WORK_UNQUEUED.labels(check.model).inc()
            log.error("%s was stored but its work never reached the queue; the response fails", rid)
        await msg.ack()

    async def _generate(self, msg: Msg) -> None:
        if self._held.lapsed(msg):
            # Delivered to this worker's pull request while it was stopped (frozen, paused
            # by its host): its ack wait ran out unread, so it is another delivery's now, or
            # will be, and an attempt started here too would race that one's.
            log.warning("a request delivered while this worker was stopped is left to its next delivery (%d)",
                        deliveries(msg) + 1)
            return
        attempt = deliveries(msg) - 1
        work = generation_work.validate_json(msg.data)
        if isinstance(work, QueueCheck):
            await self._end_unqueued(work, msg)
            return
        request = work if isinstance(work, GenerationRequest) else await self._request_of(work, msg, attempt)
        if request is None:
            return
        rid = request.response_id
        logs.bind(response_id=rid, attempt=attempt)
        trace.get_current_span().set_attributes({"steno.response_id": rid, "steno.attempt": attempt})
        if attempt > 0:
            WORK_REDELIVERED.labels(self._model).inc()
        out = _AttemptOutput()
        try:
            await self._attempt(msg, work, request, attempt, out)
        except Exception as exc:
            if attempt + 1 < MAX_DELIVER:
                raise
            # Its last delivery: given up visibly, not left for JetStream to drop in silence.
            log.exception("%s attempt %d failed on its last delivery; the response fails", rid, attempt)
            await self._give_up(rid, attempt, out, len(request.prompt_token_ids), exc)
            await msg.ack()

    async def _attempt(self, msg: Msg, work: GenerationWork, request: GenerationRequest, attempt: int,
                       out: _AttemptOutput) -> None:
        """Generates the request from where the earlier attempts left it, publishing its
        batches (counted in ``out``) and its end, and acks it."""
        rid = request.response_id
        # A request that came through the store is large; so may its parser seed be, which
        # then stays off the token stream (the parser reads it from Postgres instead).
        seeded = isinstance(work, GenerationRequest)
        subject = self._names.tokens_subject(rid)
        if attempt > 0:
            # Before reading what came before: an earlier attempt still running stops
            # publishing sooner, and what it publishes between the read and this attempt's
            # first batch would fail the response.
            await self._record_takeover(rid, attempt)
        prior = (await read_prior_output(self._js, self._names, rid, since=msg.metadata.timestamp) if attempt > 0
                 else PriorOutput())
        if prior.ended:
            log.info("%s attempt %d: an earlier attempt already ended it", rid, attempt)
            await msg.ack_sync()
            return
        out.tokens = len(prior.token_ids)
        carried = Carried.of(context_headers())

        def publish_batch(pending: PendingBatch, ended: GenerationEnded | None = None) -> asyncio.Future[None]:
            """Starts storing the attempt's next batch (the one before it is stored): with
            those of other responses ready at the same moment where it may, riding out
            trouble as ``_publish``. The future resolves once it is stored."""
            batch_no = out.batches
            body = token_batch_json(
                rid, attempt, batch_no, pending.token_ids,
                resumed_after=len(prior.token_ids) if attempt > 0 and batch_no == 0 else None,
                logprobs=pending.logprobs,
                top_logprobs=pending.top_logprobs,
                emitted_at=pending.emitted_at,
                first_emitted_at=pending.first_emitted_at,
                parser_seed_json=request.parser_seed_json if seeded and attempt == 0 and batch_no == 0 else None,
                ended=ended,
            )
            msg_id = f"{rid}:{attempt}:{batch_no}"
            if request.groupable:
                stored = self._groups.publish(rid, body, msg_id, carried)
            else:
                stored = asyncio.ensure_future(self._publish(subject, body, msg_id, carried.headers))
            # Counted as it goes, so the next batch is numbered after it whenever that is
            # sent (a number used twice is a duplicate to JetStream, dropped); taken back
            # if it is not stored, before the attempt hears of it (a batch's callbacks run
            # in the order added: this one before the coalescer's).
            tokens = len(pending.token_ids)
            out.batches += 1
            out.tokens += tokens

            def settled(stored: asyncio.Future[None]) -> None:
                if stored.cancelled() or stored.exception() is not None:
                    out.batches -= 1
                    out.tokens -= tokens
                else:
                    self._tokens_published.inc(tokens)

            stored.add_done_callback(settled)
            return stored

        started = time.monotonic()
        last, error, tail = None, None, PendingBatch()
        finish: FinishReason
        sampling = request.sampling
        if sampling.max_tokens is not None:
            sampling = sampling.model_copy(update={"max_tokens": sampling.max_tokens - len(prior.token_ids)})
        if rid in self._cancels:
            finish = "cancelled"
        elif sampling.max_tokens is not None and sampling.max_tokens <= 0:
            finish = "length"
        else:
            running = self._running.setdefault(rid, {})
            running[attempt] = out
            try:
                outputs = self._engine.generate(engine_request_id(rid, attempt), request.prompt_token_ids, sampling,
                                                prior.token_ids)
                last, tail = await coalesce(
                    outputs, publish_batch, self._window, self._batch_max_tokens, self._keepalive_s
                )
            except EngineError as exc:
                error = exc
            finally:
                del running[attempt]
                if not running and self._running.get(rid) is running:
                    del self._running[rid]
            if out.superseded_by is not None:
                # Its end would be dropped, and its ack would settle the later attempt's
                # delivery: that attempt ends the response.
                log.info("%s attempt %d: stopped, attempt %d took it over", rid, attempt, out.superseded_by)
                GENERATIONS.labels(self._model, "superseded").inc()
                return
            finish = "error" if error is not None else (last.finish_reason if last and last.finish_reason else "stop")
        # The last batch carries the attempt's end: one message, one commit, one ack less.
        ended = GenerationEnded(
            response_id=rid,
            attempt=attempt,
            batch_count=out.batches + 1,
            finish_reason=finish,
            prompt_tokens=len(request.prompt_token_ids),
            output_tokens=out.tokens + len(tail.token_ids),
            cached_tokens=last.cached_tokens if last else None,
            error_code="server_error" if error is not None else None,
            error_message=str(error) if error is not None else None,
            completed_at=int(time.time()),
        )
        await publish_batch(tail, ended)
        if self._held.lapsed(msg):
            # Another worker may be continuing it (its later attempt supersedes this one's
            # end): that one settles it, or, were it to die, the request comes back and
            # its next attempt finds the response's end, wherever it was published.
            log.warning("%s attempt %d: held past its ack wait, so left for a later attempt to settle",
                        rid, attempt)
        else:
            # Unconfirmed: were the ack lost, the redelivered request finds its end published.
            await msg.ack()
            if isinstance(work, StoredGenerationRequest):
                with suppress(Exception):  # it expires anyway; a redelivery finds the end published
                    await self._requests.delete(work.name)
        GENERATIONS.labels(self._model, finish).inc()
        PROMPT_TOKENS.labels(self._model).inc(len(request.prompt_token_ids))
        # The usual ending is not news, and a line for every request costs a formatted
        # record and a write each; a retried attempt, an error or a cancel is news.
        level = logging.DEBUG if attempt == 0 and finish in ("stop", "length") else logging.INFO
        log.log(level, "%s attempt %d: %s, %d tokens in %.3fs", rid, attempt, finish,
                out.tokens - len(prior.token_ids), time.monotonic() - started)


def engine_request_id(response_id: str, attempt: int) -> str:
    return f"{response_id}:{attempt}"
