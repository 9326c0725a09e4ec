"""The in-memory copy of a KV bucket, against real NATS JetStream."""

import asyncio
import secrets

import nats
import pytest

from steno.services.common.bus import kv_bucket
from steno.services.common.kv_mirror import KvMirror

pytestmark = pytest.mark.integration


@pytest.fixture
async def bucket(settings):
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    name = f"{settings.namespace}_mirror_{secrets.token_hex(3)}"
    kv = await kv_bucket(js, name, ttl_s=60)
    yield name, kv
    await js.delete_key_value(name)
    await nc.close()


async def test_keys_written_before_the_start_are_there_once_it_returns(bucket):
    name, kv = bucket
    await kv.put("early", b"1")
    heard: list[str] = []

    async def on_put(key: str, _: bytes) -> None:
        heard.append(key)

    mirror = KvMirror(kv, name, forget_after_s=60, on_put=on_put)
    await mirror.start()
    try:
        assert "early" in mirror
        assert "missing" not in mirror
        assert 0 <= mirror.age_s("early") < 5
        assert mirror.get("early") == b"1" and mirror.get("missing") is None
        assert heard == ["early"]  # a cancel order that came before the worker still counts
    finally:
        await mirror.stop()


async def test_after_a_reconnect_the_copy_catches_up_with_what_changed(bucket, settings):
    name, kv = bucket
    watching = await nats.connect(settings.nats_url, reconnect_time_wait=0.1)
    try:
        mirror = KvMirror(await kv_bucket(watching.jetstream(), name, ttl_s=60), name, forget_after_s=60)
        await mirror.start()
        try:
            # Drop the watcher's connection the way a NATS restart would; the client reconnects.
            watching._transport.close()
            await kv.put("during", b"1")
            assert await mirror.wait_for(lambda: "during" in mirror, timeout_s=10)
            assert watching.stats["reconnects"] >= 1
        finally:
            await mirror.stop()
    finally:
        await watching.close()


async def test_writes_after_the_start_arrive_and_call_back(bucket):
    name, kv = bucket
    heard: list[tuple[str, bytes]] = []
    forgotten: list[str] = []

    async def on_put(key: str, value: bytes) -> None:
        heard.append((key, value))

    mirror = KvMirror(kv, name, forget_after_s=60, on_put=on_put, on_forget=forgotten.append)
    await mirror.start()
    try:
        await kv.put("later", b"order")
        assert await mirror.wait_for(lambda: "later" in mirror, timeout_s=5)
        assert heard == [("later", b"order")]
        await kv.put("later", b"changed")
        assert await mirror.wait_for(lambda: mirror.get("later") == b"changed", timeout_s=5)
        await kv.delete("later")
        assert await mirror.wait_for(lambda: "later" not in mirror, timeout_s=5)
        assert heard == [("later", b"order"), ("later", b"changed")]  # a delete is not a write to act on
        assert mirror.get("later") is None
        await kv.delete("never-there")
        await kv.put("marker", b"1")
        assert await mirror.wait_for(lambda: "marker" in mirror, timeout_s=5)
        assert forgotten == ["later"]  # once, and only for a key it had
    finally:
        await mirror.stop()


async def test_a_key_is_forgotten_once_older_than_the_bucket_ttl(bucket):
    name, kv = bucket
    forgotten: list[str] = []
    mirror = KvMirror(kv, name, forget_after_s=0.3, on_forget=forgotten.append)
    await mirror.start()
    try:
        await kv.put("brief", b"1")
        assert await mirror.wait_for(lambda: "brief" in mirror, timeout_s=5)
        await asyncio.sleep(0.4)
        assert "brief" not in mirror
        await kv.put("next", b"1")  # the copy drops what lapsed when it next changes
        assert await mirror.wait_for(lambda: "next" in mirror, timeout_s=5)
        assert forgotten == ["brief"]
    finally:
        await mirror.stop()


async def test_waiting_for_a_key_that_never_comes_gives_up_after_the_timeout(bucket):
    name, kv = bucket
    mirror = KvMirror(kv, name, forget_after_s=60)
    await mirror.start()
    try:
        assert not await mirror.wait_for(lambda: "never" in mirror, timeout_s=0.2)
        assert await mirror.fetch("never") is None
        await kv.put("direct", b"1")
        assert await mirror.fetch("direct") == b"1"
    finally:
        await mirror.stop()
