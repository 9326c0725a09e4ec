"""Rendering prompts away from the event loop: the render processes are real processes
with the real tokenizer."""

import asyncio
import time

import pytest

from steno.schemas.api import CreateResponseRequest
from steno.services.api.rendering import (
    INLINE_MAX_CHARS,
    INLINE_MAX_RUN,
    PromptRenderer,
    RenderFailed,
    renders_in_place,
)
from tests.harmony_samples import harmony

PROSE = "The quick brown fox jumps over the lazy dog; then it rests. "


def request(text: str, **fields) -> CreateResponseRequest:
    return CreateResponseRequest(model="m", input=text, **fields)


def test_small_text_renders_in_place_and_large_or_unbroken_text_does_not():
    assert renders_in_place(request(PROSE * 10), [])
    assert not renders_in_place(request(PROSE * (INLINE_MAX_CHARS // len(PROSE) + 1)), [])
    assert not renders_in_place(request("x" + "a" * INLINE_MAX_RUN), [])
    assert not renders_in_place(request("x" + " " * (INLINE_MAX_RUN + 1) + "y"), [])
    assert not renders_in_place(request("hi", tools=[{"type": "function", "name": "f", "description": "z" * 300}]), [])
    history = [{"type": "message", "role": "user", "content": PROSE * (INLINE_MAX_CHARS // len(PROSE) + 1)}]
    assert not renders_in_place(request("hi"), history)


def test_a_large_prompt_renders_in_a_process_exactly_as_in_place():
    async def scenario():
        renderer = PromptRenderer(processes=1, timeout_s=30)
        try:
            big = request(PROSE * 2000, instructions="Be brief.")
            rendered = await renderer.render(harmony(), big, 1_700_000_000, [])
            return rendered, harmony().render(big, 1_700_000_000)
        finally:
            renderer.close()

    rendered, in_place = asyncio.run(scenario())
    assert rendered == in_place


def test_a_degenerate_prompt_is_refused_within_the_budget_and_the_next_one_renders():
    async def scenario():
        renderer = PromptRenderer(processes=1, timeout_s=1.5)
        try:
            await renderer.render(harmony(), request(PROSE * 2000), 0, [])  # the process is up
            started = time.monotonic()
            with pytest.raises(RenderFailed) as refused:
                await renderer.render(harmony(), request("a" * 300_000), 0, [])
            elapsed = time.monotonic() - started
            after = await renderer.render(harmony(), request(PROSE * 2000), 0, [])
            return refused.value, elapsed, after
        finally:
            renderer.close()

    refused, elapsed, after = asyncio.run(scenario())
    assert "within 2 s" in str(refused) or "within 1 s" in str(refused)
    assert elapsed < 10
    assert after.token_ids == harmony().render(request(PROSE * 2000), 0).token_ids


def test_while_a_render_runs_elsewhere_the_event_loop_keeps_turning():
    async def scenario():
        renderer = PromptRenderer(processes=1, timeout_s=2)
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        try:
            with pytest.raises(RenderFailed):
                await renderer.render(harmony(), request("a" * 300_000), 0, [])
        finally:
            ticker.cancel()
            renderer.close()
        return ticks

    assert asyncio.run(scenario()) > 50


def test_a_request_the_dialect_refuses_is_refused_naming_the_field_from_a_process_too():
    async def scenario():
        renderer = PromptRenderer(processes=1, timeout_s=30)
        try:
            bad = request("x" * (INLINE_MAX_CHARS + 1), tools=[{"type": "nonsense"}])
            with pytest.raises(RenderFailed) as refused:
                await renderer.render(harmony(), bad, 0, [])
            return refused.value
        finally:
            renderer.close()

    refused = asyncio.run(scenario())
    assert refused.param == "tools[0].type"


class TokenizerPanic(BaseException):
    """What pyo3 raises when Rust code panics: a BaseException, not an Exception."""


class PanickingDialect:
    """A dialect whose tokenizer panics (openai-harmony's does on inputs of a megabyte or
    more, after minutes of work; this one at once)."""

    name = "harmony"

    def render(self, *args, **kwargs):
        raise TokenizerPanic("called `Result::unwrap()` on an `Err` value")


def test_a_tokenizer_panic_is_a_render_failure_not_a_crash():
    renderer = PromptRenderer(processes=1, timeout_s=5)
    with pytest.raises(RenderFailed) as refused:
        asyncio.run(renderer.render(PanickingDialect(), request("x"), 0, []))
    assert "could not be tokenized" in str(refused.value) and "TokenizerPanic" in str(refused.value)
