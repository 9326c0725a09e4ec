"""Readiness: how checks' results make the report, and checks that fail or hang."""

from __future__ import annotations

import asyncio

from steno.services.common import health
from steno.services.common.health import Readiness, flag, readiness_report


def test_the_report_names_the_failing_checks() -> None:
    ready, body = readiness_report({"nats": (True, "connected"), "postgres": (False, "refused")})
    assert not ready
    assert body["failing"] == ["postgres"]
    assert body["checks"]["postgres"] == {"ok": False, "reason": "refused"}
    assert readiness_report({"nats": (True, "connected")})[0]


async def test_a_check_that_raises_or_hangs_fails_with_a_reason(monkeypatch) -> None:
    monkeypatch.setattr(health, "CHECK_TIMEOUT_S", 0.05)

    async def raises() -> tuple[bool, str]:
        raise ConnectionRefusedError("connection refused")

    async def hangs() -> tuple[bool, str]:
        await asyncio.sleep(10)
        return True, "never"

    ready, body = await Readiness({"raises": raises, "hangs": hangs,
                                   "engine": lambda: flag(lambda: True, "loaded", "dead")}).evaluate()
    assert not ready
    assert body["failing"] == ["raises", "hangs"]
    assert "connection refused" in body["checks"]["raises"]["reason"]
    assert "no answer" in body["checks"]["hangs"]["reason"]
    assert body["checks"]["engine"] == {"ok": True, "reason": "loaded"}
