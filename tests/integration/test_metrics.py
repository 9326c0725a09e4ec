"""The metrics of a stack of its own move as a scripted request mix says they must:
requests by route and status, cancels, generations and tokens matching the usage the
SDK reports, events matching the log, latency histograms filled, queue gauges there."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import asyncpg
import openai
import pytest

from steno.infra.embedded import free_port
from steno.services.common.config import ApiSettings
from steno.services.common.db import asyncpg_dsn
from tests.conftest import separate_stack
from tests.scraped_metrics import scrape, value

MODEL = "steno-simulator"
SLOW = "steno-slow"
WAIT_S = 30.0


def has(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> bool:
    wanted = set(labels.items())
    return any(sample == name and wanted <= sample_labels for sample, sample_labels in samples)


def wait_until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S}s: {what}")
        time.sleep(0.2)


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=3) as answer:
            return answer.status == 200
    except OSError:
        return False


def test_metrics_follow_a_scripted_request_mix(settings: ApiSettings, tmp_path: Path) -> None:
    with separate_stack(settings, "metrics", tmp_path) as stack:
        ports = {name: free_port() for name in ("parser", "worker", "slow")}
        stack.add("parser-0", "parser", "--metrics-port", str(ports["parser"]))
        stack.add("worker-0", "worker", "--sim-tokens-per-s", "2000", "--metrics-port", str(ports["worker"]))
        stack.add("worker-slow", "worker", "--model", SLOW, "--sim-tokens-per-s", "5", "--sim-answer-tokens", "500",
                  "--metrics-port", str(ports["slow"]))
        stack.add_api()
        api = stack.base_url.removesuffix("/v1")
        parser, worker, slow = (f"http://127.0.0.1:{ports[name]}" for name in ("parser", "worker", "slow"))
        for url in (api, parser, worker, slow):
            wait_until(f"{url}/readyz answers 200", lambda url=url: ready(url))
        client = openai.OpenAI(base_url=stack.base_url, api_key=stack.keys["a"], max_retries=0)

        usages, ids = [], []
        for turn in range(3):
            for event in client.responses.create(model=MODEL, input=f"Say hello {turn}", stream=True):
                if event.type == "response.completed":
                    usages.append(event.response.usage)
                    ids.append(event.response.id)
        for turn in range(2):
            answer = client.responses.create(model=MODEL, input=f"Say goodbye {turn}")
            usages.append(answer.usage)
            ids.append(answer.id)
        with pytest.raises(openai.BadRequestError):
            client.responses.create(model=MODEL, input="never stored", background=True, store=False)
        background = client.responses.create(model=SLOW, input="Tell a long story", background=True)
        assert client.responses.cancel(background.id).status == "cancelled"

        # The worker counts an attempt once its end is acknowledged, which can come
        # after the client has seen the response complete.
        wait_until("the worker counted 5 generations",
                   lambda: value(scrape(worker), "steno_generations_total", model=MODEL) == 5)
        wait_until("the slow worker counted the cancelled generation",
                   lambda: value(scrape(slow), "steno_generations_total", model=SLOW) == 1)

        def queue_gauges_complete() -> bool:
            # Refreshed every few seconds: one refresh may predate the parser's consumers.
            gauges = scrape(api)
            return (has(gauges, "steno_consumer_pending_messages", stream="gen", model=MODEL)
                    and has(gauges, "steno_consumer_pending_messages", stream="tokens", partition="0"))

        wait_until("the queue gauges cover the model and the token partitions", queue_gauges_complete)

        at_api, at_worker, at_slow, at_parser = scrape(api), scrape(worker), scrape(slow), scrape(parser)
        requests = "steno_api_requests_total"
        assert value(at_api, requests, method="POST", route="/v1/responses", status="200") == 6
        assert value(at_api, requests, method="POST", route="/v1/responses", status="400") == 1
        assert value(at_api, requests, method="POST", route="/v1/responses/{response_id}/cancel", status="200") == 1
        assert value(at_api, "steno_cancels_total") == 1
        assert value(at_api, "steno_cancel_seconds_count") == 1
        assert value(at_api, "steno_response_first_event_seconds_count", model=MODEL) == 3
        assert value(at_api, "steno_response_first_content_seconds_count", model=MODEL) == 3
        assert value(at_api, "steno_edge_replay_seconds_count") > 0
        assert value(at_api, "steno_edge_streams") == 0
        assert has(at_api, "steno_consumer_ack_pending_messages", stream="gen", model=MODEL)
        assert has(at_api, "steno_consumer_pending_messages", stream="tokens", partition="0")

        assert value(at_worker, "steno_generations_total", model=MODEL, finish_reason="stop") == 5
        assert value(at_worker, "steno_generated_tokens_total", model=MODEL) == sum(u.output_tokens for u in usages)
        assert value(at_worker, "steno_prompt_tokens_total", model=MODEL) == sum(u.input_tokens for u in usages)
        assert value(at_worker, "steno_work_redelivered_total", model=MODEL) == 0
        assert value(at_worker, "steno_worker_in_flight", model=MODEL) == 0
        assert value(at_worker, "steno_worker_free_slots", model=MODEL) == 64
        assert value(at_worker, "steno_worker_batch_window_seconds", model=MODEL) == 0.02  # a few streams: the base
        assert value(at_slow, "steno_generations_total", model=SLOW, finish_reason="cancelled") == 1

        assert value(at_parser, "steno_events_total", model=MODEL) == _events_after_created(stack.settings, ids)
        assert value(at_parser, "steno_parser_commit_seconds_count") > 0
        assert value(at_parser, "steno_parser_commit_responses_sum") >= 5
        assert value(at_parser, "steno_partitions_taken_over_total", holder="parser") == 0


def _events_after_created(settings: ApiSettings, response_ids: list[str]) -> int:
    """The events the parser wrote for these responses (all but the API's seq 0)."""
    import asyncio

    async def count() -> int:
        conn = await asyncpg.connect(asyncpg_dsn(settings.database_url))
        try:
            return int(await conn.fetchval(
                "SELECT count(*) FROM response_events WHERE response_id = ANY($1::text[]) AND seq > 0", response_ids))
        finally:
            await conn.close()

    return asyncio.run(count())
