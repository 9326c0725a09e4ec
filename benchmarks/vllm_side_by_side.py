"""``steno bench --scenarios vllm``: Steno with a vLLM worker against vLLM's own OpenAI
server, on the same tiny model, the same prompt token ids, grammar and ``max_tokens``.

Both sides run the tiny random Llama that the vLLM tests build (o200k/Harmony vocabulary),
greedy, with the structural tag Steno's worker uses for a JSON ``text.format``: the
random model then writes well-formed Harmony (an optional empty analysis, then a final
JSON message), so Steno's parser has content to emit, and vLLM's server gets the very
same grammar through ``/v1/completions`` (``structured_outputs.structural_tag``).
vLLM's server returns raw completion text with no Responses events: what Steno adds on
top is the price of the events, the log and durability.

Needs vLLM importable: ``infra/vllm-env run steno bench --scenarios vllm``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson

from steno.infra.embedded import free_port
from steno.infra.processes import ServiceProcess, wait_healthy
from steno.schemas.api import CreateResponseRequest
from steno.services.api.response_plan import plan_response
from steno.services.dialects import DEFAULT_DIALECT, dialect_named

MODEL = "steno-tiny"
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
ENGINE_ARGS = ["--dtype", "bfloat16", "--max-model-len", "2048", "--enforce-eager",
               "--kv-cache-memory-bytes", str(256 << 20)]
PROMPT = "Answer in JSON: what is event sourcing?"
STARTUP_TIMEOUT_S = 600.0
MESSAGE_START = "<|message|>"
SPECIAL = re.compile(r"<\|[a-z_]+\|>")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def steno_body(max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "input": PROMPT, "stream": True, "temperature": 0, "max_output_tokens": max_tokens,
            "text": {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}}}


def completions_body(max_tokens: int) -> dict[str, Any]:
    """The same prompt token ids Steno renders, and the same grammar its worker applies."""
    dialect = dialect_named(DEFAULT_DIALECT)
    request = CreateResponseRequest.model_validate({k: v for k, v in steno_body(max_tokens).items() if k != "stream"})
    created_at = int(time.time())
    plan = plan_response(request, "resp_side_by_side", "bench", created_at, dialect.render(request, created_at))
    grammar = dialect.answer_grammar(SCHEMA, "final", None)
    return {"model": MODEL, "prompt": plan.generation.prompt_token_ids, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "skip_special_tokens": False,
            "structured_outputs": {"structural_tag": json.dumps(grammar)}}


async def steno_stream(http: httpx.AsyncClient, url: str, max_tokens: int) -> dict[str, float]:
    started = time.perf_counter()
    first = None
    tokens = 0
    async with http.stream("POST", url, json=steno_body(max_tokens)) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            if first is None and ".delta" in line[:60]:
                first = time.perf_counter()
            if '"response.completed"' in line[:40] or '"response.incomplete"' in line[:40]:
                tokens = orjson.loads(line[6:])["response"]["usage"]["output_tokens"]
    done = time.perf_counter()
    return {"first_content_s": (first or done) - started, "total_s": done - started, "tokens": tokens}


async def vllm_stream(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, float]:
    started = time.perf_counter()
    first = None
    tokens = 0
    text = ""
    async with http.stream("POST", url, json=body) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            if chunk.get("choices"):
                text += chunk["choices"][0].get("text") or ""
                # The first character of a message's content (up to the special token that
                # ends it): where Steno sends its first delta.
                if first is None and MESSAGE_START in text and SPECIAL.split(text.rsplit(MESSAGE_START, 1)[1])[0]:
                    first = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    done = time.perf_counter()
    return {"first_content_s": (first or done) - started, "total_s": done - started, "tokens": tokens}


def _summary(samples: list[dict[str, float]], wall_s: float) -> dict[str, Any]:
    first = [s["first_content_s"] * 1000 for s in samples]
    return {"streams": len(samples), "first_content_ms_p50": _pct(first, .5), "first_content_ms_p99": _pct(first, .99),
            "tokens_per_s": sum(s["tokens"] for s in samples) / wall_s,
            "tokens_per_stream": sum(s["tokens"] for s in samples) / max(len(samples), 1)}


async def _rounds(run_one, level: int, rounds: int) -> dict[str, Any]:
    samples: list[dict[str, float]] = []
    started = time.perf_counter()
    for _ in range(rounds):
        samples += await asyncio.gather(*(run_one() for _ in range(level)))
    return _summary(samples, time.perf_counter() - started)


async def side_by_side(bench, work: Path, levels: list[int], max_tokens: int, rounds: int) -> dict[str, Any]:
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("vllm: vLLM is not importable here; run `infra/vllm-env run steno bench --scenarios vllm`", flush=True)
        return {"skipped": "vLLM not installed in this environment"}
    from steno.infra.tiny_model import build_harmony_tokenizer, build_tiny_llama

    model_dir = work / "tiny-model"
    model_dir.mkdir(exist_ok=True)
    build_tiny_llama(model_dir)
    build_harmony_tokenizer(model_dir)

    port = free_port()
    with open(work / "vllm-serve.log", "ab") as log:
        serve_process = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
             "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), *ENGINE_ARGS],
            stdout=log, stderr=subprocess.STDOUT)
    server = ServiceProcess("vllm-serve", [], work / "vllm-serve.log", serve_process)
    worker = bench.stack.add("worker-vllm", "worker", "--engine", "vllm", "--model", MODEL, "--model-path",
                             str(model_dir), "--batch-interval-ms", "20", *ENGINE_ARGS)
    try:
        await asyncio.to_thread(wait_healthy, f"http://127.0.0.1:{port}", server, STARTUP_TIMEOUT_S)
        steno_url = bench.steno_url
        vllm_url = f"http://127.0.0.1:{port}/v1/completions"
        completions = completions_body(max_tokens)
        out: dict[str, Any] = {"model": "tiny random Llama (o200k_harmony vocabulary), bfloat16, CPU",
                               "max_tokens": max_tokens}
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=max(levels) + 8)) as http:
            await _wait_for_worker(http, steno_url, worker, max_tokens)
            await vllm_stream(http, vllm_url, completions)  # warm up
            for level in levels:
                run_steno = partial(steno_stream, http, steno_url, max_tokens)
                run_served = partial(vllm_stream, http, vllm_url, completions)
                # One untimed round each at this concurrency first, as the ttfe scenario does.
                await _rounds(run_steno, level, 1)
                await _rounds(run_served, level, 1)
                steno = await _rounds(run_steno, level, rounds)
                served = await _rounds(run_served, level, rounds)
                row = {"steno": steno, "vllm_serve": served,
                       "added_first_content_ms_p50": steno["first_content_ms_p50"] - served["first_content_ms_p50"],
                       "added_first_content_ms_p99": steno["first_content_ms_p99"] - served["first_content_ms_p99"],
                       "ratio_tokens_per_s": steno["tokens_per_s"] / max(served["tokens_per_s"], 1e-9)}
                out[str(level)] = row
                print(f"vllm {level:>3} streams: steno (vLLM worker) first content p50"
                      f" {steno['first_content_ms_p50']:.1f}"
                      f" ms p99 {steno['first_content_ms_p99']:.1f} ms, {steno['tokens_per_s']:,.0f} tok/s | vllm serve"
                      f" p50 {served['first_content_ms_p50']:.1f} ms p99 {served['first_content_ms_p99']:.1f} ms,"
                      f" {served['tokens_per_s']:,.0f} tok/s | added p50 {row['added_first_content_ms_p50']:.1f} ms,"
                      f" throughput ratio {row['ratio_tokens_per_s']:.2f} | tokens per stream"
                      f" {steno['tokens_per_stream']:.0f}/{served['tokens_per_stream']:.0f}", flush=True)
        return out
    finally:
        for process in (server, worker):
            _stop_with_descendants(process)


def _stop_with_descendants(process: ServiceProcess) -> None:
    """vLLM runs its engine core as a child process: never leave one behind."""
    import psutil  # a vLLM dependency

    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        children = []
    process.stop(timeout_s=30)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()


async def _wait_for_worker(http: httpx.AsyncClient, url: str, worker: ServiceProcess, max_tokens: int) -> None:
    """The vLLM worker registers its model once its engine is up (a minute or more on CPU)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if worker.exited() is not None:
            raise RuntimeError(f"the vLLM worker exited:\n{worker.log_text()[-4000:]}")
        try:
            await steno_stream(http, url, max_tokens)
            return
        except httpx.HTTPStatusError:
            await asyncio.sleep(2)
    raise RuntimeError(f"the vLLM worker did not come up:\n{worker.log_text()[-4000:]}")
