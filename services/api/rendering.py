"""Rendering prompts without holding up the API's event loop.

A tokenizer holds the interpreter lock while it works, and byte-pair encoding is
quadratic in the length of one unbroken run of characters (a long run of one letter,
or of spaces), so one request could freeze a replica for minutes, and a large enough
one makes the tokenizer panic. Most requests are small and quick to render in place.
A request with much text, or with a long unbroken run, is rendered in a separate
process instead, within a time budget: a render that overruns it is a 400 and its
process is replaced, and nothing else waits behind it. A tokenizer panic is a 400 too.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import pickle
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from steno.schemas.api import CreateResponseRequest
from steno.services import dialects
from steno.services.dialects import Dialect, InvalidInput, RenderedPrompt

log = logging.getLogger(__name__)

# Rendered in place when the request's text is at most this long and has no unbroken
# run longer than INLINE_MAX_RUN (the cost of a render is then linear and small).
INLINE_MAX_CHARS = 64 * 1024
INLINE_MAX_RUN = 256
_LONG_RUN = re.compile(rf"\S{{{INLINE_MAX_RUN + 1},}}|\s{{{INLINE_MAX_RUN + 1},}}")


class RenderFailed(Exception):
    """The prompt could not be rendered: a 400 naming ``param``."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self) -> tuple[type[RenderFailed], tuple[str, str | None]]:
        return RenderFailed, (str(self), self.param)  # it crosses from a render process


def renders_in_place(request: CreateResponseRequest, history: Sequence[dict[str, Any]]) -> bool:
    """Whether the text that goes into the prompt (the input, instructions, tools and
    earlier turns) is small and free of long unbroken runs."""
    total = 0
    pending: list[Any] = [request.input, request.instructions, request.tools, request.tool_choice, list(history)]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            total += len(value)
            if total > INLINE_MAX_CHARS or (len(value) > INLINE_MAX_RUN and _LONG_RUN.search(value)):
                return False
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return True


def _render(dialect: Dialect, request: CreateResponseRequest, created_at: int,
            history: Sequence[dict[str, Any]], reuse_scope: str) -> RenderedPrompt:
    try:
        return dialect.render(request, created_at, history, reuse_scope)
    except InvalidInput as exc:
        raise RenderFailed(str(exc), exc.param) from exc
    except Exception as exc:
        raise RenderFailed(f"The input could not be tokenized ({type(exc).__name__}).", None) from exc
    except BaseException as exc:  # a tokenizer panic (pyo3's PanicException) is not an Exception
        if isinstance(exc, (KeyboardInterrupt, SystemExit, asyncio.CancelledError)):
            raise
        raise RenderFailed(f"The input could not be tokenized ({type(exc).__name__}).", None) from None


@dataclass
class _Job:
    dialect: str
    # The model files the dialect is built from (in the local model files directory).
    dialect_files: str | None
    request: CreateResponseRequest
    created_at: int
    history: list[dict[str, Any]]
    reuse_scope: str


def _serve(jobs: Connection) -> None:
    """A render process: renders each job it receives and sends back the prompt or why not."""
    # Ctrl-C reaches the whole process group; the API stops this process itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    dialects.load_all()
    while True:
        try:
            job: _Job = pickle.loads(jobs.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            dialect = dialects.dialect_for(job.dialect, job.dialect_files)
            reply: RenderedPrompt | RenderFailed = _render(dialect, job.request, job.created_at, job.history,
                                                           job.reuse_scope)
        except RenderFailed as failed:
            reply = failed
        jobs.send_bytes(pickle.dumps(reply))


class _RenderProcess:
    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.jobs, child_end = context.Pipe()
        self.process: BaseProcess = context.Process(target=_serve, args=(child_end,), name="steno-render",
                                                    daemon=True)
        self.process.start()
        child_end.close()

    def exchange(self, job: bytes, timeout_s: float) -> bytes | None:
        """Sends a job and waits for its reply (in a thread: it blocks); None on timeout."""
        self.jobs.send_bytes(job)
        if not self.jobs.poll(timeout_s):
            return None
        return self.jobs.recv_bytes()

    def stop(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.jobs.close()


class PromptRenderer:
    """Renders small requests in place and the rest in up to ``processes`` render
    processes (started when first needed), each render within ``timeout_s``."""

    def __init__(self, processes: int, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._slots = asyncio.Semaphore(processes)
        self._idle: list[_RenderProcess] = []

    async def render(self, dialect: Dialect, request: CreateResponseRequest, created_at: int,
                     history: Sequence[dict[str, Any]], reuse_scope: str = "") -> RenderedPrompt:
        """Raises RenderFailed for what cannot be rendered (in time). ``reuse_scope``:
        the tenant (see ``Dialect.render``)."""
        if renders_in_place(request, history):
            return _render(dialect, request, created_at, history, reuse_scope)
        job = pickle.dumps(_Job(dialect.name, dialect.files, request, created_at, list(history), reuse_scope))
        async with self._slots:
            worker = self._idle.pop() if self._idle else await asyncio.to_thread(_RenderProcess)
            try:
                reply = await asyncio.to_thread(worker.exchange, job, self._timeout_s)
            except (EOFError, OSError) as exc:  # the process died under the job
                worker.stop()
                raise RenderFailed("The input could not be tokenized (the tokenizer failed).", None) from exc
            except BaseException:
                worker.stop()  # cancelled mid-exchange: its pipe may hold half a job or reply
                raise
            if reply is None:
                log.warning("a prompt took more than %.0f s to render; its render process is replaced",
                            self._timeout_s)
                worker.stop()
                raise RenderFailed(f"The input could not be tokenized within {self._timeout_s:.0f} s; it holds "
                                   "very long runs of characters without a break.", None)
            self._idle.append(worker)
        rendered: RenderedPrompt | RenderFailed = pickle.loads(reply)
        if isinstance(rendered, RenderFailed):
            raise rendered
        return rendered

    def close(self) -> None:
        for worker in self._idle:
            worker.stop()
        self._idle.clear()
