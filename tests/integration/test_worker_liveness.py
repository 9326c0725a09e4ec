"""A live worker keeps the requests it holds for as long as it generates them: its
heartbeats hold off redelivery however many ack waits a generation lasts, and however
slow the bus answers its other reads, so another worker never takes a live one's
request over; one frozen past its ack wait, thawed, stops its attempt as it hears of the
worker that took the request over, and leaves the request to it. A request that fails
on every delivery ends visibly, and so does one whose every delivery went to a worker
that stopped with it."""

import asyncio
import contextlib
import os
import signal
import time
from contextlib import asynccontextmanager

import asyncpg
import openai
import orjson
import pytest
from nats.js.errors import NotFoundError

from steno.infra.embedded import free_port
from steno.infra.processes import ServiceProcess, Stack, remove_namespace
from steno.schemas.api import CreateResponseRequest
from steno.schemas.bus import GenerationRequest, MaxDeliveriesAdvisory
from steno.schemas.ids import new_response_id
from steno.services.common import bus
from steno.services.common.in_progress import ACK_WAIT_S, BEAT_S
from steno.services.common.kv_mirror import KvMirror
from steno.services.dialects import DEFAULT_DIALECT, dialect_named
from steno.services.worker import worker as worker_module
from steno.services.worker.prior_output import read_prior_output
from steno.services.worker.simulator import SimulatorEngine, SimulatorTiming
from tests.conftest import separate_stack, started_in_background
from tests.scraped_metrics import scrape, value
from tests.work_queue import queued_requests

pytestmark = pytest.mark.integration

MODEL = "steno-liveness"


async def attempts_stored(database_url: str, response_id: str) -> list[int]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT DISTINCT attempt FROM response_tokens WHERE response_id = $1 ORDER BY 1",
                                response_id)
        return [row[0] for row in rows]
    finally:
        await conn.close()


def test_a_generation_lasting_several_ack_waits_stays_with_its_worker(settings, tmp_path):
    stack = Stack(settings.with_changes(namespace=settings.namespace + "liveness"), tmp_path)
    stack.create_key("a")
    try:
        stack.add("parser", "parser")
        # Two workers: a request redelivered would go on at either.
        for name in ("worker-1", "worker-2"):
            stack.add(name, "worker", "--model", MODEL, "--sim-tokens-per-s", "8")
        stack.add_api()
        client = openai.OpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0)
        prompt = "keep this one " * 12
        started = time.monotonic()
        with client.responses.stream(model=MODEL, input=prompt) as stream:
            events = list(stream)
        # The generation outlasted the ack wait several times over (what this test is about).
        assert time.monotonic() - started > 3 * ACK_WAIT_S
        final = events[-1].response
        assert final.status == "completed"
        assert final.output_text == "Steno simulator reply: " + " ".join(prompt.split())
        assert [e.sequence_number for e in events] == list(range(len(events)))
        # One attempt only: no other worker took it up meanwhile.
        assert asyncio.run(attempts_stored(stack.settings.database_url, final.id)) == [0]
    finally:
        stack.stop()
        remove_namespace(stack.settings)


HELD = 64


@asynccontextmanager
async def worker_in_process(settings, suffix: str, engine, **options):
    """A GenerationWorker of ``MODEL`` on ``engine`` in this process, in a namespace of its
    own, once its consumer is in place: yields the test's JetStream context and names."""
    names = bus.Names(settings.namespace + suffix, settings.token_partitions)
    nc = await bus.connect(settings, f"test-worker-{suffix}")
    js = nc.jetstream()
    worker = worker_module.GenerationWorker(nc, names, MODEL, engine, dialect=DEFAULT_DIALECT, instance_id=suffix,
                                            **options)
    running = asyncio.create_task(worker.run())
    try:
        await bus.ensure_streams(js, names)
        deadline = time.monotonic() + 10
        while True:
            try:
                await js.consumer_info(names.gen_stream, names.worker_consumer(MODEL))
                break
            except Exception:
                assert time.monotonic() < deadline, "the worker's consumer never appeared"
                await asyncio.sleep(0.1)
        yield js, names
    finally:
        await worker.stop(1.0)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await bus.remove_namespace(js, names)
        await nc.close()


async def test_a_worker_keeps_many_held_requests_while_its_cancel_reads_are_slow(settings, monkeypatch):
    """On a loaded bus every read is slow. The worker's own check of its running
    requests' cancel flags then takes long, and the beats that keep those requests from
    redelivery must not wait for it: a request redelivered while its worker lives is
    generated twice, and the second attempt cannot continue what the first publishes."""
    read = KvMirror.fetch

    async def slow_read(self, key):
        await asyncio.sleep(0.05)
        return await read(self, key)

    monkeypatch.setattr(KvMirror, "fetch", slow_read)
    monkeypatch.setattr(worker_module, "CANCEL_CHECK_S", 1.0)
    dialect = dialect_named(DEFAULT_DIALECT)
    # Long generations: every one of them is still running when the checks come. Free
    # slots beside them, so that a request redelivered would be taken at once.
    engine = SimulatorEngine(dialect, SimulatorTiming(tokens_per_s=5), answer_tokens=200)
    async with worker_in_process(settings, "beats", engine, concurrency=2 * HELD) as (js, names):
        prompt = dialect.render(CreateResponseRequest(model=MODEL, input="hold on"), 1_700_000_000).token_ids
        for _ in range(HELD):
            request = GenerationRequest(response_id=new_response_id(), model=MODEL, prompt_token_ids=prompt)
            await js.publish(names.gen_subject(MODEL), request.model_dump_json().encode())
        # Two direct checks of 64 slow reads each, one after another more than the ack wait.
        await asyncio.sleep(2 + 3 * ACK_WAIT_S)
        info = await js.consumer_info(names.gen_stream, names.worker_consumer(MODEL))
        assert info.num_ack_pending == HELD  # all still generating here
        assert info.num_redelivered == 0


class BrokenEngine:
    """Fails every request in a way the worker does not expect of an engine (not an
    EngineError): a bug, or a request that breaks it."""

    name = "broken"
    context_tokens = 4096

    async def generate(self, request_id, prompt_token_ids, sampling, prior_output=()):
        raise RuntimeError("engine bug")
        yield  # an async generator, as engines are

    async def abort(self, request_id):
        return None

    async def wait_until_dead(self):
        await asyncio.Event().wait()

    async def close(self):
        return None


async def test_a_request_that_fails_on_every_delivery_ends_visibly(settings):
    """Its last delivery publishes the response's end, an error, instead of leaving
    JetStream to drop the request and the response to wait for good."""
    async with worker_in_process(settings, "broken", BrokenEngine()) as (js, names):
        response_id = new_response_id()
        request = GenerationRequest(response_id=response_id, model=MODEL, prompt_token_ids=[1, 2, 3])
        await js.publish(names.gen_subject(MODEL), request.model_dump_json().encode())
        # Handed back after each failure (a second's delay), then given up.
        deadline = time.monotonic() + worker_module.MAX_DELIVER * 3
        while not (prior := await read_prior_output(js, names, response_id)).ended:
            assert time.monotonic() < deadline, "no end was published"
            await asyncio.sleep(0.5)
        subscription = await js.pull_subscribe(names.tokens_subject(response_id), stream=names.tokens_stream)
        [message] = await subscription.fetch(1, timeout=5)
        ended = orjson.loads(message.data)
        assert ended["kind"] == "ended" and ended["finish_reason"] == "error"
        assert ended["attempt"] == worker_module.MAX_DELIVER - 1
        assert "every delivery" in ended["error_message"]
        assert prior.token_ids == []


def served_one_at_a_time(stack: Stack, metrics_port: int) -> tuple[ServiceProcess, openai.OpenAI]:
    """A parser, a worker generating one request at a time at 8 tokens/s (returned), its
    metrics on ``metrics_port``, and an API process."""
    stack.add("parser", "parser")
    worker = stack.add("worker-1", "worker", "--model", MODEL, "--sim-tokens-per-s", "8", "--concurrency", "1",
                       "--metrics-port", str(metrics_port))
    stack.add_api()
    return worker, openai.OpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0)


def test_a_worker_frozen_past_its_ack_wait_leaves_the_request_to_the_one_that_took_it_over(settings, tmp_path):
    """The first worker is frozen mid-generation, so the request goes to a second; that one
    is frozen in turn and the first, thawed, ends its own attempt (superseded). Its ack would settle
    the request for good (JetStream takes an ack from any delivery), so when the second
    then dies nothing would continue the response: the first leaves it unacked, and the
    request comes back to it to continue from where the second stopped."""
    metrics_port = free_port()
    frozen: list = []
    with separate_stack(settings, "frozen", tmp_path) as stack:
        try:
            first, client = served_one_at_a_time(stack, metrics_port)
            prompt = "continue this one " * 12
            created = started_in_background(client, MODEL, prompt)
            frozen_and_taken_over(stack, client, created.id, first, metrics_port, frozen)

            deadline = time.monotonic() + 30
            while (final := client.responses.retrieve(created.id)).status == "in_progress":
                assert time.monotonic() < deadline, "nothing continued the response"
                time.sleep(0.1)
            assert final.status == "completed"
            assert final.output_text == "Steno simulator reply: " + " ".join(prompt.split())
            with client.responses.stream(response_id=created.id) as stream:
                events = list(stream)
            assert [e.sequence_number for e in events] == list(range(len(events)))
            # The first worker's, the second's, and the one that continued after the second died.
            assert len(asyncio.run(attempts_stored(stack.settings.database_url, created.id))) == 3
        finally:
            for process in frozen:
                os.kill(process.pid, signal.SIGCONT)


def test_a_worker_thawed_after_its_request_was_taken_over_stops_generating_it(settings, tmp_path):
    """Frozen past its ack wait, the first worker loses the request to a second, which
    records its takeover. Thawed, the first stops its attempt as the takeover reaches it
    (its engine's work would be thrown away, and the parser would drop what it publishes),
    well before the response ends, and publishes no end of it: the second ends the
    response alone, whole."""
    first_port, second_port = free_port(), free_port()
    with separate_stack(settings, "superseded", tmp_path) as stack:
        first, client = served_one_at_a_time(stack, first_port)
        prompt = "stop when taken over " * 24
        created = started_in_background(client, MODEL, prompt)
        os.kill(first.pid, signal.SIGSTOP)
        try:
            stack.add("worker-2", "worker", "--model", MODEL, "--sim-tokens-per-s", "8", "--concurrency", "1",
                      "--metrics-port", str(second_port))
            deadline = time.monotonic() + 30
            while len(asyncio.run(attempts_stored(stack.settings.database_url, created.id))) < 2:
                assert time.monotonic() < deadline, "the second worker never took the request over"
                time.sleep(0.1)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        deadline = time.monotonic() + 5
        while value(first_metrics := scrape(f"http://127.0.0.1:{first_port}"), "steno_worker_in_flight") > 0:
            assert time.monotonic() < deadline, "the first worker went on generating the request"
            time.sleep(0.1)
        assert client.responses.retrieve(created.id).status == "in_progress"  # stopped before the end
        assert value(first_metrics, "steno_generations_total") == 1
        assert value(first_metrics, "steno_generations_total", finish_reason="superseded") == 1

        deadline = time.monotonic() + 60
        while (final := client.responses.retrieve(created.id)).status == "in_progress":
            assert time.monotonic() < deadline, "the second worker never ended the response"
            time.sleep(0.2)
        assert final.status == "completed"
        # The simulator echoes the first 400 characters: a reply that outlasts the stop.
        assert final.output_text == "Steno simulator reply: " + " ".join(prompt.split())[:400]
        with client.responses.stream(response_id=created.id) as stream:
            events = list(stream)
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert asyncio.run(attempts_stored(stack.settings.database_url, created.id)) == [0, 1]
        assert value(scrape(f"http://127.0.0.1:{second_port}"), "steno_generations_total", finish_reason="stop") == 1
        assert value(scrape(f"http://127.0.0.1:{first_port}"), "steno_generations_total") == 1


def served_by_one_worker(stack: Stack) -> tuple[ServiceProcess, openai.OpenAI]:
    """A parser, a worker of the model (returned) and an API process, once the model is served."""
    stack.add("parser", "parser")
    worker = stack.add("worker-1", "worker", "--model", MODEL)
    stack.add_api()
    client = openai.OpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0)
    deadline = time.monotonic() + 30
    while MODEL not in {model.id for model in client.models.list()}:
        assert time.monotonic() < deadline, "the worker never registered its model"
        time.sleep(0.1)
    return worker, client


async def taken_unacked(settings) -> int:
    """How many of the model's requests a worker holds now, as its consumer counts them."""
    names = bus.Names.from_settings(settings)
    nc = await bus.connect(settings, "test-held-requests")
    try:
        info = await nc.jetstream().consumer_info(names.gen_stream, names.worker_consumer(MODEL))
        return info.num_ack_pending
    finally:
        await nc.close()


def test_a_request_delivered_while_its_worker_was_stopped_is_left_to_its_next_delivery(settings, tmp_path):
    """A stopped worker's open pull request still takes deliveries until it ends (it
    lives less than a held request takes to lapse): each lapses unread, and the worker,
    woken, reads it as some later delivery's by then; one started would race that. It
    starts none: the delivery after its wake generates the response, alone."""
    with separate_stack(settings, "stopped", tmp_path) as stack:
        worker, client = served_by_one_worker(stack)
        for _ in range(5):
            time.sleep(2 * BEAT_S)  # its beats under way: a stop shows as the gap between two
            os.kill(worker.pid, signal.SIGSTOP)
            try:
                created = client.responses.create(model=MODEL, input="delivered while nobody read", background=True)
                time.sleep(0.2)
                # Or its pull request had just ended: the request waits for it in JetStream.
                taken_while_stopped = asyncio.run(taken_unacked(stack.settings)) == 1
                if taken_while_stopped:
                    time.sleep(2 * ACK_WAIT_S)  # long past its lapse
            finally:
                os.kill(worker.pid, signal.SIGCONT)
            deadline = time.monotonic() + 30
            while (final := client.responses.retrieve(created.id)).status in ("queued", "in_progress"):
                assert time.monotonic() < deadline, "the response was left waiting"
                time.sleep(0.1)
            assert final.status == "completed"
            assert final.output_text == "Steno simulator reply: delivered while nobody read"
            if taken_while_stopped:
                break
        else:
            pytest.fail("no request reached the stopped worker's pull request in five tries")
        [attempt] = asyncio.run(attempts_stored(stack.settings.database_url, created.id))
        assert attempt >= 1
        assert "left to its next delivery" in worker.log_text()


def frozen_and_taken_over(stack: Stack, client: openai.OpenAI, response_id: str, first, metrics_port: int,
                          frozen: list) -> None:
    """Freezes ``first``, the worker generating the response, until a second worker has
    taken it over; freezes that one, thaws the first until it has ended its own attempt,
    then kills the second. ``frozen``: the processes stopped at any moment. Each worker
    runs one request at a time, so one that holds the request has no pull request open
    to take in any of its deliveries while frozen: each goes to the worker awake."""
    os.kill(first.pid, signal.SIGSTOP)
    frozen.append(first)
    second = stack.add("worker-2", "worker", "--model", MODEL, "--sim-tokens-per-s", "8", "--concurrency", "1")
    deadline = time.monotonic() + 30
    while len(asyncio.run(attempts_stored(stack.settings.database_url, response_id))) < 2:
        assert time.monotonic() < deadline, "the second worker never took the request over"
        time.sleep(0.1)
    os.kill(second.pid, signal.SIGSTOP)
    frozen.append(second)
    os.kill(first.pid, signal.SIGCONT)
    frozen.remove(first)
    deadline = time.monotonic() + 30
    while value(scrape(f"http://127.0.0.1:{metrics_port}"), "steno_generations_total") < 1:
        assert time.monotonic() < deadline, "the first worker never ended its attempt"
        time.sleep(0.1)
    assert client.responses.retrieve(response_id).status == "in_progress"  # its end came second
    second.stop(signal.SIGKILL)
    frozen.remove(second)


async def taken_and_dropped(settings, deliveries: int) -> None:
    """Takes the model's one waiting request ``deliveries`` times, as workers that stop
    with it would (a request that crashes its engine's process, say): never acked, each
    delivery left to lapse after the ack wait. A last pull finds it delivered as often as
    it may be: JetStream gives it up then, and says so while no worker runs."""
    names = bus.Names.from_settings(settings)
    nc = await bus.connect(settings, "test-dying-workers")
    try:
        feed = await nc.jetstream().pull_subscribe_bind(names.worker_consumer(MODEL), names.gen_stream)
        for delivery in range(1, deliveries + 1):
            [msg] = await feed.fetch(1, timeout=15)
            assert msg.metadata.num_delivered == delivery
            await asyncio.sleep(ACK_WAIT_S + 0.3)
        with pytest.raises(asyncio.TimeoutError):
            await feed.fetch(1, timeout=2)
        await feed.unsubscribe()
    finally:
        await nc.close()


async def kept_advisories(settings) -> list[MaxDeliveriesAdvisory]:
    names = bus.Names.from_settings(settings)
    nc = await bus.connect(settings, "test-advisories")
    try:
        js = nc.jetstream()
        state = (await js.stream_info(names.exhausted_work_stream)).state
        kept = []
        for seq in range(state.first_seq, state.last_seq + 1) if state.messages else ():
            with contextlib.suppress(NotFoundError):  # acked
                kept.append(MaxDeliveriesAdvisory.model_validate_json(
                    (await js.get_msg(names.exhausted_work_stream, seq)).data))
        return kept
    finally:
        await nc.close()


def test_a_request_whose_every_worker_stops_with_it_fails_visibly(settings, tmp_path):
    """JetStream delivers a request no more once it has delivered it as often as the
    consumer allows, and says so in an advisory, once, to whoever listens then. No worker
    is left to give it up, nor to hear it: the advisory is kept, and the next worker
    started ends the response as failed, rather than leaving it in progress for good,
    and takes the request off the queue."""
    with separate_stack(settings, "exhausted", tmp_path) as stack:
        first, client = served_by_one_worker(stack)
        # Gone, its registration lives on for a few seconds: the request is accepted.
        first.stop(signal.SIGKILL)
        created = client.responses.create(model=MODEL, input="a request no worker survives", background=True)
        names = bus.Names.from_settings(stack.settings)
        asyncio.run(taken_and_dropped(stack.settings, worker_module.MAX_DELIVER))
        assert client.responses.retrieve(created.id).status == "queued"  # nothing ends it by itself
        [advisory] = asyncio.run(kept_advisories(stack.settings))
        assert (advisory.stream, advisory.consumer, advisory.deliveries) == (
            names.gen_stream, names.worker_consumer(MODEL), worker_module.MAX_DELIVER)

        # Two, either may take the advisory: one end is recorded.
        stack.add("worker-2", "worker", "--model", MODEL)
        stack.add("worker-3", "worker", "--model", MODEL)
        deadline = time.monotonic() + 30
        while (final := client.responses.retrieve(created.id)).status in ("queued", "in_progress"):
            assert time.monotonic() < deadline, "the response was left waiting"
            time.sleep(0.2)
        assert final.status == "failed"
        assert final.error is not None and final.error.code == "server_error"
        assert f"taken up {worker_module.MAX_DELIVER} times" in final.error.message
        with client.responses.stream(response_id=created.id) as stream:
            events = list(stream)
        assert [e.type for e in events][-2:] == ["error", "response.failed"]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        # The request and the advisory are taken off once the end is published.
        deadline = time.monotonic() + 10
        while asyncio.run(kept_advisories(stack.settings)):
            assert time.monotonic() < deadline, "the advisory was never acked"
            time.sleep(0.2)
        assert asyncio.run(queued_requests(stack.settings)) == 0
