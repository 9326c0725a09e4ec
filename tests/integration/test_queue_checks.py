"""An API process that stops between storing a response and queuing its work leaves the
response queued with nothing to run it: the queue checks of the namespace's API
processes find it and a worker fails it visibly, while a response whose work waits in
the queue is left to run, and one of another deployment's API processes is left alone."""

from __future__ import annotations

import asyncio
import signal
import time

import asyncpg
import openai
import pytest

from steno.infra.embedded import free_port
from steno.schemas.bus import QueueCheck
from steno.schemas.ids import new_response_id, origin_of
from steno.services.api import queue_checks
from steno.services.api.store import ResponseStore
from steno.services.common import bus
from steno.services.common.db import asyncpg_dsn
from steno.services.worker import worker as worker_module
from tests.conftest import separate_stack
from tests.scraped_metrics import scrape, value
from tests.token_streams import create, publish_grouped, stream_of
from tests.work_queue import queued_requests

pytestmark = pytest.mark.integration

MODEL = "steno-simulator"
# Not a tenant any other test uses: its responses stay queued here.
FOREIGN_TENANT = "queue-check-foreign"


async def stored_as_an_api_would(settings, response_id: str, tenant: str = "a",
                                 text: str = "a request whose API stopped") -> None:
    """The response row, its input and first events, as the API stores them before it
    queues the work; the work never follows."""
    pool = await asyncpg.create_pool(asyncpg_dsn(settings.database_url), min_size=1, max_size=1)
    try:
        await create(pool, response_id, text, tenant=tenant)
    finally:
        await pool.close()


async def forget(settings, response_id: str, tenant: str) -> None:
    pool = await asyncpg.create_pool(asyncpg_dsn(settings.database_url), min_size=1, max_size=1)
    try:
        await ResponseStore(pool).delete(response_id, tenant)
    finally:
        await pool.close()


async def streams_made(settings) -> None:
    nc = await bus.connect(settings, "test-streams")
    try:
        await bus.ensure_streams(nc.jetstream(), bus.Names.from_settings(settings))
    finally:
        await nc.close()


async def checked(settings, response_id: str) -> None:
    """A check published as an API process publishes it."""
    names = bus.Names.from_settings(settings)
    nc = await bus.connect(settings, "test-queue-check")
    try:
        check = QueueCheck(response_id=response_id, model=MODEL)
        await nc.jetstream().publish(names.gen_subject(MODEL), check.model_dump_json().encode(),
                                     headers={"Nats-Msg-Id": response_id})
    finally:
        await nc.close()


def registered(client: openai.OpenAI) -> None:
    deadline = time.monotonic() + 30
    while MODEL not in {model.id for model in client.models.list()}:
        assert time.monotonic() < deadline, "the worker never registered its model"
        time.sleep(0.1)


def test_a_response_whose_work_never_reached_the_queue_fails_visibly(settings, tmp_path):
    with separate_stack(settings, "unqueued", tmp_path) as stack:
        stack.add("parser", "parser")
        first_worker = stack.add("worker-1", "worker", "--model", MODEL)
        first_api = stack.add_api()
        client = openai.OpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0)
        registered(client)
        # No worker for longer than the checks wait: the work waits in the queue.
        first_worker.stop(signal.SIGKILL)
        waiting = client.responses.create(model=MODEL, input="wait for a worker", background=True)
        # The first API process stores one more and stops before queuing its work.
        lost = new_response_id(origin_of(waiting.id))
        asyncio.run(stored_as_an_api_would(stack.settings, lost))
        # And one stored minutes before, its API process down since: no API process of
        # the namespace ran for longer than a crash loop's backoff.
        lost_earlier = new_response_id(origin_of(waiting.id))
        asyncio.run(stored_as_an_api_would(stack.settings, lost_earlier, text="a request stored minutes ago"))
        asyncio.run(stored_minutes_before(stack.settings, lost_earlier, 5))
        first_api.stop(signal.SIGKILL)
        # One of an origin no API process of this namespace recorded (another deployment
        # on the same database).
        foreign = new_response_id()
        asyncio.run(stored_as_an_api_would(stack.settings, foreign, tenant=FOREIGN_TENANT))
        try:
            stack.add_api()
            client = openai.OpenAI(base_url=stack.url_of(1), api_key=stack.keys["a"], max_retries=0)
            # The lost responses' checks are kept; the waiting one's is a duplicate of its work.
            deadline = time.monotonic() + queue_checks.CHECK_AFTER_S + 30
            while asyncio.run(queued_requests(stack.settings)) < 3:
                assert time.monotonic() < deadline, "no check was kept"
                time.sleep(0.5)
            time.sleep(2 * queue_checks.CHECK_EVERY_S)
            assert asyncio.run(queued_requests(stack.settings)) == 3
            assert client.responses.retrieve(lost).status == "queued"  # until a worker takes the check

            metrics_port = free_port()
            stack.add("worker-2", "worker", "--model", MODEL, "--metrics-port", str(metrics_port))
            deadline = time.monotonic() + 30
            for response_id in (lost, lost_earlier):
                while (final := client.responses.retrieve(response_id)).status == "queued":
                    assert time.monotonic() < deadline, "the lost response was left queued"
                    time.sleep(0.2)
                assert final.status == "failed"
                assert final.error is not None and final.error.code == "server_error"
                assert final.error.message == worker_module.UNQUEUED
                with client.responses.stream(response_id=response_id) as stream:
                    events = list(stream)
                assert [e.type for e in events][-2:] == ["error", "response.failed"]
                assert [e.sequence_number for e in events] == list(range(len(events)))
            assert value(scrape(f"http://127.0.0.1:{metrics_port}"), "steno_work_unqueued_total") == 2

            while (ran := client.responses.retrieve(waiting.id)).status in ("queued", "in_progress"):
                assert time.monotonic() < deadline, "the waiting response never ran"
                time.sleep(0.2)
            assert ran.status == "completed" and ran.output_text

            time.sleep(queue_checks.CHECK_EVERY_S)
            with pytest.raises(openai.NotFoundError):  # another tenant's: this key cannot see it
                client.responses.retrieve(foreign)
            assert asyncio.run(queued_requests(stack.settings)) == 0
            assert asyncio.run(status_of(stack.settings, foreign)) == "queued"
        finally:
            asyncio.run(forget(stack.settings, foreign, FOREIGN_TENANT))


async def stored_minutes_before(settings, response_id: str, minutes: int) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(settings.database_url))
    try:
        await conn.execute("UPDATE responses SET created_at = created_at - make_interval(mins => $2) WHERE id = $1",
                           response_id, minutes)
    finally:
        await conn.close()


async def status_of(settings, response_id: str) -> str:
    conn = await asyncpg.connect(asyncpg_dsn(settings.database_url))
    try:
        return await conn.fetchval("SELECT status FROM responses WHERE id = $1", response_id)
    finally:
        await conn.close()


def test_a_check_kept_for_work_already_done_fails_nothing(settings, tmp_path):
    """A NATS restart forgets the message ids of work done and gone from the queue, so
    a check may be kept for a response whose output was all published while no parser
    had marked it in progress yet: the worker that takes the check finds that output
    and drops the check, and the response completes as generated."""
    with separate_stack(settings, "checked-done", tmp_path) as stack:
        response_id, said = new_response_id(), "all of it published before the check"
        asyncio.run(streams_made(stack.settings))
        asyncio.run(stored_as_an_api_would(stack.settings, response_id, text=said))
        # In groups, as a worker stepping it with others publishes it: no message id of
        # the response's own, and no parser has read it yet.
        asyncio.run(publish_grouped(stack.settings, [stream_of(response_id, said)]))
        asyncio.run(checked(stack.settings, response_id))
        assert asyncio.run(queued_requests(stack.settings)) == 1  # kept: no work had its id
        metrics_port = free_port()
        stack.add("worker", "worker", "--model", MODEL, "--metrics-port", str(metrics_port))
        deadline = time.monotonic() + 30
        while asyncio.run(queued_requests(stack.settings)) > 0:
            assert time.monotonic() < deadline, "no worker took the check"
            time.sleep(0.2)
        assert value(scrape(f"http://127.0.0.1:{metrics_port}"), "steno_work_unqueued_total") == 0

        stack.add("parser", "parser")
        stack.add_api()
        client = openai.OpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0)
        deadline = time.monotonic() + 30
        while (final := client.responses.retrieve(response_id)).status in ("queued", "in_progress"):
            assert time.monotonic() < deadline, "the response never ended"
            time.sleep(0.2)
        assert final.status == "completed"
        assert final.output_text == said


async def origins(settings, namespace: str | None = None) -> dict[str, float]:
    """The recorded origins (of one namespace, if named), with the seconds since each
    was last seen."""
    conn = await asyncpg.connect(asyncpg_dsn(settings.database_url))
    try:
        rows = await conn.fetch("SELECT origin, extract(epoch FROM now() - seen_at)::float8 AS unseen_s"
                                " FROM api_origins WHERE $1::text IS NULL OR namespace = $1", namespace)
        return {row["origin"]: row["unseen_s"] for row in rows}
    finally:
        await conn.close()


async def seen_before(settings, origin: str, namespace: str, seconds: float) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(settings.database_url))
    try:
        await conn.execute("INSERT INTO api_origins (origin, namespace, seen_at)"
                           " VALUES ($1, $2, now() - make_interval(secs => $3))"
                           " ON CONFLICT (origin) DO UPDATE SET seen_at = excluded.seen_at",
                           origin, namespace, seconds)
    finally:
        await conn.close()


def test_the_origins_of_processes_long_gone_are_forgotten_and_live_ones_kept(settings, tmp_path):
    with separate_stack(settings, "origins", tmp_path) as stack:
        stack.add_api()
        namespace = stack.settings.namespace
        deadline = time.monotonic() + 10
        while not (started := asyncio.run(origins(stack.settings, namespace))):  # recorded as it starts
            assert time.monotonic() < deadline, "the API process never recorded its origin"
            time.sleep(0.2)
        (live,) = started
        gone, gone_elsewhere, recent = (origin_of(new_response_id()) for _ in range(3))
        long_ago = queue_checks.ORIGIN_FORGOTTEN_AFTER_S + 60
        asyncio.run(seen_before(stack.settings, gone, namespace, long_ago))
        asyncio.run(seen_before(stack.settings, gone_elsewhere, namespace + "-another", long_ago))
        # Its responses may still be queued within the checks' reach: kept.
        asyncio.run(seen_before(stack.settings, recent, namespace, queue_checks.CHECK_UNTIL_S))
        # A live process whose rounds had stalled: marked seen again, if forgotten meanwhile.
        asyncio.run(seen_before(stack.settings, live, namespace, long_ago))

        deadline = time.monotonic() + 3 * queue_checks.CHECK_EVERY_S
        while {gone, gone_elsewhere} & (recorded := asyncio.run(origins(stack.settings))).keys():
            assert time.monotonic() < deadline, "the origins of processes long gone were kept"
            time.sleep(0.5)
        while (recorded := asyncio.run(origins(stack.settings))).get(live, long_ago) > queue_checks.CHECK_EVERY_S + 5:
            assert time.monotonic() < deadline, "a live process's origin was not marked seen again"
            time.sleep(0.5)
        assert recent in recorded
