"""A stack started before its NATS has JetStream: each service waits for JetStream (saying
so in its log) instead of exiting, and serves once it is there; one whose streams it
cannot use exits, saying why."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai
import pytest
from nats.js.api import RetentionPolicy, StreamConfig

from steno.infra import stack as steno_up
from steno.infra.embedded import free_port
from steno.infra.processes import ServiceProcess, Stack, wait_healthy
from steno.services.common import bus
from steno.services.common.config import ApiSettings, Settings
from tests.fault.infra import NatsNode

pytestmark = pytest.mark.integration

WAITING = "JetStream did not answer"
# Well inside the services' patience (bus.START_PATIENCE_S), start-up included.
SEEN_WAITING_WITHIN_S = 40.0


def wait_until_waiting(processes: list[ServiceProcess]) -> None:
    deadline = time.monotonic() + SEEN_WAITING_WITHIN_S
    for process in processes:
        while WAITING not in process.log_text():
            assert process.exited() is None, f"{process.name} exited:\n{process.log_text()}"
            assert time.monotonic() < deadline, f"{process.name} never waited for JetStream:\n{process.log_text()}"
            time.sleep(0.2)


async def every_service_exited(stack: Stack) -> list[ServiceProcess]:
    """Starts a parser, a worker and an API in ``stack`` and waits for all three to exit."""
    processes = [stack.add("parser", "parser"), stack.add("worker", "worker"),
                 stack.add("api", "api", "--port", str(free_port()))]
    deadline = time.monotonic() + SEEN_WAITING_WITHIN_S
    while any(process.exited() is None for process in processes):
        assert time.monotonic() < deadline, stack.logs()
        await asyncio.sleep(0.2)
    return processes


def test_services_started_before_jetstream_wait_for_it_and_then_serve(settings: ApiSettings, tmp_path: Path):
    port = free_port()
    core_only = NatsNode(tmp_path, "n0", port, None, [], jetstream=False)
    core_only.start()
    # The NATS is the test's own, and so are the streams it will hold.
    stack = Stack(settings.with_changes(nats_url=f"nats://127.0.0.1:{port}", auth_disabled=True), tmp_path)
    with_jetstream: NatsNode | None = None
    try:
        parser = stack.add("parser", "parser")
        worker = stack.add("worker", "worker", "--sim-tokens-per-s", "0")
        # A chat-template model's worker publishes the model's files too.
        chat_worker = stack.add("worker-qwen3", "worker", "--model", "sim-qwen3", "--sim-dialect", "qwen3",
                                "--sim-tokens-per-s", "0")
        api_port = free_port()
        stack.api_ports.append(api_port)
        api = stack.add("api", "api", "--port", str(api_port))
        wait_until_waiting([parser, worker, chat_worker, api])

        # The same server restarted with JetStream, as when it comes back after an upgrade.
        core_only.stop()
        with_jetstream = NatsNode(tmp_path, "n0", port, None, [])
        with_jetstream.start()
        wait_healthy(f"http://127.0.0.1:{api_port}", api)
        client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)
        for model in ("steno-simulator", "sim-qwen3"):
            response = client.responses.create(model=model, input="Say hello")
            assert response.status == "completed", stack.logs()
            assert response.output_text
        assert [process.exited() for process in (parser, worker, chat_worker, api)] == [None] * 4, stack.logs()
    except Exception:
        print(stack.logs())
        raise
    finally:
        stack.stop()
        for server in (core_only, with_jetstream):
            if server is not None:
                server.stop()


async def test_a_stream_that_cannot_take_the_settings_ends_each_service_visibly(settings: ApiSettings, tmp_path: Path):
    """An error that waiting cannot mend (here the token stream, made by something else
    as a work queue, which JetStream will not turn into a log) is not waited out: each
    service exits with a failure and says why, for its supervisor and its operator."""
    stack = Stack(settings.with_changes(namespace=settings.namespace + "clash", auth_disabled=True), tmp_path)
    names = bus.Names.from_settings(stack.settings)
    nc = await bus.connect(stack.settings, "steno-test")
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=names.tokens_stream, subjects=[f"{names.namespace}.tokens.>"],
                                     retention=RetentionPolicy.WORK_QUEUE))
    try:
        processes = await every_service_exited(stack)
        for process in processes:
            assert process.exited() != 0, process.log_text()
            assert "retention" in process.log_text(), process.log_text()
            assert WAITING not in process.log_text()
    finally:
        stack.stop()
        await bus.remove_namespace(js, names)
        await nc.close()


async def test_a_process_set_to_another_partition_count_than_the_stream_s_refuses_to_start(
        settings: ApiSettings, tmp_path: Path):
    """Every service must use the token stream's partition count: a worker set to more
    would publish batches on partitions no parser reads, and responses would stall
    unseen. A service set to another count exits instead, naming both."""
    stack = Stack(settings.with_changes(namespace=settings.namespace + "parts", auth_disabled=True,
                                        token_partitions=settings.token_partitions + 1), tmp_path)
    made = bus.Names(stack.settings.namespace, settings.token_partitions)
    nc = await bus.connect(stack.settings, "steno-test")
    js = nc.jetstream()
    try:
        await bus.ensure_streams(js, made)
        await bus.ensure_streams(js, made)  # the same count again: accepted
        with pytest.raises(bus.PartitionCountMismatch, match=f"made for {settings.token_partitions} partitions"):
            await bus.ensure_streams(js, bus.Names.from_settings(stack.settings))
        processes = await every_service_exited(stack)
        wanted = (f"made for {settings.token_partitions} partitions and this process is set to "
                  f"{settings.token_partitions + 1} (STENO_TOKEN_PARTITIONS)")
        for process in processes:
            assert process.exited() != 0, process.log_text()
            assert wanted in process.log_text(), process.log_text()
    finally:
        stack.stop()
        await bus.remove_namespace(js, made)
        await nc.close()


async def test_a_token_stream_made_before_it_named_its_partitions_takes_the_first_count_declared(
        settings: ApiSettings):
    """A deployment's stream from a release that did not name the count: the first
    process to start names its own, and holds the rest to it."""
    names = bus.Names(settings.namespace + "undescribed", settings.token_partitions)
    nc = await bus.connect(settings, "steno-test")
    js = nc.jetstream()
    try:
        await js.add_stream(StreamConfig(name=names.tokens_stream, subjects=[f"{names.namespace}.tokens.>"],
                                         retention=RetentionPolicy.LIMITS))
        await bus.ensure_streams(js, names)
        described = (await js.stream_info(names.tokens_stream)).config.description
        assert f" in {settings.token_partitions} partitions " in described
        with pytest.raises(bus.PartitionCountMismatch):
            await bus.ensure_streams(js, bus.Names(names.namespace, settings.token_partitions * 2))
    finally:
        await bus.remove_namespace(js, names)
        await nc.close()


async def test_a_work_stream_made_with_the_earlier_duplicate_window_takes_the_longer_one_and_keeps_its_work(
        settings: ApiSettings):
    """The queue checks tell lost work from waiting work only within the work stream's
    duplicate window: a deployment's stream from a release with a shorter one is brought
    to it as any service starts, the requests waiting there kept, their ids still known."""
    names = bus.Names(settings.namespace + "window", settings.token_partitions)
    nc = await bus.connect(settings, "steno-test")
    js = nc.jetstream()
    try:
        await js.add_stream(StreamConfig(name=names.gen_stream, subjects=[f"{names.namespace}.gen.>"],
                                         retention=RetentionPolicy.WORK_QUEUE, duplicate_window=120))
        await js.publish(names.gen_subject("m"), b"{}", headers={"Nats-Msg-Id": "resp_waiting"})
        await bus.ensure_streams(js, names)
        info = await js.stream_info(names.gen_stream)
        assert info.config.duplicate_window == bus.WORK_DUPLICATE_WINDOW_S
        assert info.state.messages == 1
        again = await js.publish(names.gen_subject("m"), b"{}", headers={"Nats-Msg-Id": "resp_waiting"})
        assert again.duplicate
    finally:
        await bus.remove_namespace(js, names)
        await nc.close()


def left_at_the_default_count(settings: ApiSettings, **changes: object) -> ApiSettings:
    """``settings`` as a deployment that never set STENO_TOKEN_PARTITIONS has them."""
    return ApiSettings(**settings.model_dump(exclude={"token_partitions"})).with_changes(**changes)


async def test_services_left_at_the_default_count_serve_a_stream_made_for_another(settings: ApiSettings,
                                                                                   tmp_path: Path):
    """An upgrade across a change of the default: the deployment's token stream was made
    for another count, and nothing names it. Each service takes the stream's count, so
    every partition the workers publish on keeps a parser, and streams go on."""
    stack = Stack(left_at_the_default_count(settings, namespace=settings.namespace + "made", auth_disabled=True),
                  tmp_path)
    assert not stack.settings.token_partitions_chosen
    made_for = Settings.model_fields["token_partitions"].default + 3
    made = bus.Names(stack.settings.namespace, made_for)
    nc = await bus.connect(stack.settings, "steno-test")
    js = nc.jetstream()
    try:
        await bus.ensure_streams(js, made)
        services = [stack.add("parser", "parser"), stack.add("worker", "worker")]
        assert await steno_up.wait_until_served(stack.settings, "steno-simulator", services, 60, print,
                                                lambda: False)
        services.append(stack.add_api())
        client = openai.AsyncOpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60)
        # Until every partition has had a response (ids are random; ten rounds are plenty).
        partitions: set[int] = set()
        for _ in range(10):
            responses = await asyncio.gather(*[client.responses.create(model="steno-simulator", input=f"Say {n}")
                                               for n in range(made_for)])
            assert {response.status for response in responses} == {"completed"}, stack.logs()
            partitions |= {bus.partition_of(response.id, made_for) for response in responses}
            if len(partitions) == made_for:
                break
        assert partitions == set(range(made_for))
        consumers = {consumer.config.durable_name for consumer in await js.consumers_info(made.tokens_stream)}
        assert consumers == {made.parser_consumer(p) for p in range(made_for)}
        described = (await js.stream_info(made.tokens_stream)).config.description
        assert f" in {made_for} partitions " in described
        for process in services:
            assert process.exited() is None, process.log_text()
            assert f"{made_for} partitions, as it was made" in process.log_text(), process.log_text()
    finally:
        stack.stop()
        await bus.remove_namespace(js, made)
        await nc.close()


async def test_the_deployment_s_count_comes_from_its_stream_or_its_parsers_consumers(settings: ApiSettings):
    """A new deployment takes the process's count; an existing stream that names no
    count (from a release before it named one) is read by its parsers' consumers, and a
    count asked for must match it."""
    defaulted = bus.Names.from_settings(left_at_the_default_count(settings, namespace=settings.namespace + "old"))
    nc = await bus.connect(settings, "steno-test")
    js = nc.jetstream()
    try:
        assert await bus.deployment_names(js, defaulted) == defaulted
        await js.add_stream(StreamConfig(name=defaulted.tokens_stream, subjects=[f"{defaulted.namespace}.tokens.>"],
                                         retention=RetentionPolicy.LIMITS))
        assert await bus.deployment_names(js, defaulted) == defaulted  # no parser has read it yet
        made_for = defaulted.token_partitions + 2
        for partition in range(made_for):
            await js.add_consumer(defaulted.tokens_stream, bus.durable_pull_config(
                defaulted.parser_consumer(partition), defaulted.tokens_partition_filter(partition), 1, 10))
        assert (await bus.deployment_names(js, defaulted)).token_partitions == made_for
        chosen = bus.Names(defaulted.namespace, made_for)
        assert await bus.deployment_names(js, chosen) == chosen
        with pytest.raises(bus.PartitionCountMismatch, match=f"made for {made_for} partitions and this process is "
                                                             f"set to {made_for - 1} "):
            await bus.deployment_names(js, bus.Names(defaulted.namespace, made_for - 1))
    finally:
        await bus.remove_namespace(js, defaulted)
        await nc.close()
