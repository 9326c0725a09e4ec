"""``steno bench --profile``: where each service's CPU goes while a scenario's load runs.

py-spy (in the ``bench`` extra) samples every Steno process while Steno's side of a
scenario runs. Each process's samples are kept as py-spy writes them (collapsed stacks:
one line per distinct stack, its frames joined by ``;``, then its count), in
``<out>/profiles/<scenario>-<level>/<service>.txt``, and summed up by function: its own
share of the samples (it was running) and its share with what it called (it was on the
stack). A thread that waits is not sampled, so the shares are of each process's busy
time. Sampling stops each process briefly, which costs it some CPU: a profiled run's
figures are for these shares, not for comparing with a run that was not profiled."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLES_PER_S = 100
TOP_OWN = 20
TOP_ON_STACK = 40
# Functions on the stack of nearly as many samples as the most common one (the entry
# point, the event loop's run) say nothing about where the time goes. Not of all
# samples: those of a process's other threads lack the main thread's entry point.
EVERYWHERE = 0.9
PRINTED = 5
INSTALL_HINT = "pip install 'steno[bench]'"


def find_py_spy() -> str:
    """py-spy beside this Python (a virtual environment's ``bin``), else on the PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.exists():
        return str(beside)
    found = shutil.which("py-spy")
    if found is None:
        raise SystemExit(f"steno bench --profile needs py-spy, which is not installed here: {INSTALL_HINT}")
    return found


def function_of(frame: str) -> str:
    """A sampled frame without its line: ``f (pkg/mod.py:12)`` -> ``f (pkg/mod.py)``, so
    that a function's lines add up."""
    name, opening, where = frame.rpartition(" (")
    path, colon, line = where.removesuffix(")").rpartition(":")
    if not opening or not colon or not line.isdigit():
        return frame
    return f"{name} ({path})"


@dataclass(frozen=True)
class Profile:
    """One process's samples summed up: the functions with the largest shares, largest
    first, as (function, share of the samples)."""

    samples: int
    own: list[tuple[str, float]]
    on_stack: list[tuple[str, float]]

    def as_json(self) -> dict[str, Any]:
        return {"samples": self.samples, "own": [list(pair) for pair in self.own],
                "on_stack": [list(pair) for pair in self.on_stack]}


def summarize(collapsed: Iterable[str], top_own: int = TOP_OWN, top_on_stack: int = TOP_ON_STACK) -> Profile:
    """Sums collapsed stacks by function. A function that recurses counts once per
    sample on the stack; lines that are not a stack and a count are skipped."""
    own: Counter[str] = Counter()
    on_stack: Counter[str] = Counter()
    total = 0
    for line in collapsed:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        functions = [function_of(frame) for frame in stack.split(";")]
        total += samples
        own[functions[-1]] += samples
        for function in set(functions):
            on_stack[function] += samples

    if total == 0:
        return Profile(0, [], [])
    widest = on_stack.most_common(1)[0][1]
    telling = [(function, n) for function, n in on_stack.most_common() if n < EVERYWHERE * widest]
    return Profile(total, [(function, round(n / total, 4)) for function, n in own.most_common(top_own)],
                   [(function, round(n / total, 4)) for function, n in telling[:top_on_stack]])


class Profiler:
    """Samples processes with py-spy for the span of ``profiling``; keeps each label's
    summaries in ``results``."""

    def __init__(self, folder: Path, samples_per_s: int = SAMPLES_PER_S) -> None:
        self.folder = folder
        self.samples_per_s = samples_per_s
        self.results: dict[str, dict[str, Any]] = {}
        self._py_spy = find_py_spy()

    @asynccontextmanager
    async def profiling(self, label: str, pids: dict[str, int]) -> AsyncIterator[None]:
        folder = self.folder / label
        folder.mkdir(parents=True, exist_ok=True)
        samplers = {}
        for name, pid in pids.items():
            with open(folder / f"{name}.py-spy.log", "wb") as log:
                samplers[name] = subprocess.Popen(
                    [self._py_spy, "record", "--nonblocking", "--format", "raw", "--rate", str(self.samples_per_s),
                     "--pid", str(pid), "--output", str(folder / f"{name}.txt")],
                    stdout=log, stderr=subprocess.STDOUT)
        try:
            yield
        finally:
            # py-spy writes what it sampled when interrupted, as after a Ctrl-C.
            for sampler in samplers.values():
                sampler.send_signal(signal.SIGINT)
            await asyncio.gather(*(asyncio.to_thread(sampler.wait, 30) for sampler in samplers.values()))
        self.results[label] = {name: self._summary(folder, name) for name in samplers}
        print(f"profile {label}:", flush=True)
        for name, summary in self.results[label].items():
            print(f"  {name}: " + _printed(summary), flush=True)

    def _summary(self, folder: Path, name: str) -> dict[str, Any]:
        samples = folder / f"{name}.txt"
        if not samples.exists():
            said = (folder / f"{name}.py-spy.log").read_text(errors="replace").strip().splitlines()
            return {"error": "py-spy wrote no samples: " + (said[-1] if said else "it said nothing")}
        with open(samples) as lines:
            return summarize(lines).as_json()


def _printed(summary: dict[str, Any]) -> str:
    if "error" in summary:
        return summary["error"]
    own = ", ".join(f"{share:.1%} {function}" for function, share in summary["own"][:PRINTED])
    return f"{summary['samples']:,} samples; own {own}"
