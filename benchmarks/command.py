"""The ``steno bench`` command: its options, and the run. The harness needs the ``bench``
extra (an HTTP client, a plotting library), which a plain install of Steno does not
have; it is imported only when a benchmark runs, and a missing piece is named."""

from __future__ import annotations

import argparse
from pathlib import Path

from steno.benchmarks.profiles import SAMPLES_PER_S
from steno.services.common.config import Settings
from steno.services.dialects.chat_template.families import FAMILIES

# What every service uses unless STENO_TOKEN_PARTITIONS says otherwise.
DEFAULT_TOKEN_PARTITIONS: int = Settings.model_fields["token_partitions"].default

SCENARIOS = ["ttfe", "throughput", "parser", "fanout", "replay", "storage", "cancel", "retention", "affinity", "steady",
             "vllm"]
EXTRA_HINT = "pip install 'steno[bench]'"


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive whole number")
    return number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenarios", default="all", help=f"comma-separated: {', '.join(SCENARIOS)} (default all)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--logs", type=Path, default=None,
                        help="keep the services' logs in this folder (default: a temporary one, removed)")
    parser.add_argument("--api-replicas", type=int, default=1,
                        help="API processes, sharing one port as `steno up --api N` runs them (the kernel spreads "
                             "the streams' connections over them)")
    parser.add_argument("--token-partitions", type=int, default=DEFAULT_TOKEN_PARTITIONS,
                        help=f"the stack's STENO_TOKEN_PARTITIONS (default {DEFAULT_TOKEN_PARTITIONS}, the services' "
                             "default): a worker publishes a message per partition and engine step")
    parser.add_argument("--profile", action="store_true",
                        help="sample each Steno process with py-spy while Steno's side of the ttfe, throughput and "
                             "steady scenarios runs: the samples and where each process's time went are written to "
                             "OUT/profiles and results.json (sampling costs the processes CPU of its own)")
    parser.add_argument("--profile-rate", type=_positive, default=SAMPLES_PER_S,
                        help=f"samples a second with --profile (default {SAMPLES_PER_S}; a short scenario's "
                             "processes give few samples at that rate, and more cost py-spy more CPU beside them)")
    parser.add_argument("--ttfe-levels", default="1,16,128")
    parser.add_argument("--ttfe-samples", type=int, default=96, help="streams per level (at least 3 rounds)")
    parser.add_argument("--throughput-levels", default="8,32,128")
    parser.add_argument("--seconds", type=float, default=8.0, help="per throughput level")
    parser.add_argument("--parser-responses", type=int, default=400)
    parser.add_argument("--parser-batch-tokens", type=int, default=4)
    parser.add_argument("--parser-family", default=None, choices=sorted(FAMILIES),
                        help="a chat-template family (qwen3, llama3, ...) for the parser scenario's model, "
                             "simulated with its byte-level vocabulary (default gpt-oss)")
    parser.add_argument("--fanout-clients", type=int, default=2000)
    parser.add_argument("--replay-events", type=int, default=10_000)
    parser.add_argument("--cancels", type=int, default=10)
    parser.add_argument("--retention-expired", type=int, default=20_000, help="expired responses to sweep")
    parser.add_argument("--retention-rounds", type=int, default=60, help="rounds of 16 streams (at most, sweeping)")
    parser.add_argument("--affinity-workers", type=int, default=3, help="workers of the model (affinity)")
    parser.add_argument("--affinity-conversations", type=int, default=24)
    parser.add_argument("--affinity-turns", type=int, default=6)
    parser.add_argument("--steady-levels", default="64,256", help="concurrent streams (steady)")
    parser.add_argument("--steady-tokens", type=int, default=1000, help="tokens per response (steady)")
    parser.add_argument("--steady-rate", type=float, default=50.0, help="tokens/s of each stream (steady)")
    parser.add_argument("--steady-limit-ms", type=float, default=50.0,
                        help="added p99 per delta that the search for the most streams keeps under (steady)")
    parser.add_argument("--steady-max-streams", type=int, default=1024, help="where that search stops (steady)")
    parser.add_argument("--steady-batch-interval-ms", type=float, default=20.0,
                        help="the steady worker's token batch coalescing window (steady)")
    parser.add_argument("--vllm-levels", default="1,16", help="concurrent streams, vLLM side by side")
    parser.add_argument("--vllm-max-tokens", type=int, default=64)
    parser.add_argument("--vllm-rounds", type=int, default=6, help="rounds of streams per level")


def run(args: argparse.Namespace) -> None:
    unknown = sorted(set(args.scenarios.split(",")) - set(SCENARIOS)) if args.scenarios != "all" else []
    if unknown:
        raise SystemExit(f"steno bench: unknown scenarios {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    try:
        import httpx  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"steno bench needs the benchmark extra, which is not installed here "
                         f"(no module named {exc.name!r}): {EXTRA_HINT}") from exc
    from steno.benchmarks import harness

    harness.main(args)
