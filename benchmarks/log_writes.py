"""What the event log's writes cost Postgres, by what a commit holds (not a test).

It drives the parser's own commit (``EventLog.commit`` over ``create_parser_pools``, as
the parser does) in a scratch database of its own, with synthetic responses, one shape
of write after another:

- ``events``: each response's events alone (``--events`` of about ``--payload-bytes``);
- ``batches``: its token batches alone (``--batches`` of ``--batch-tokens`` tokens),
  each checked against its response by the batches' foreign key;
- ``both``: events and batches, what a running response's commit holds;
- ``ending``: both and the response's end (its row updated with its final snapshot, its
  output items indexed), what its last commit holds.

Each shape runs ``--commits`` commits of ``--responses-per-commit`` responses, in rounds
that alternate the shapes, and reports per response: the CPU of every Postgres process
on this machine (so Postgres must run here, and the rest of it should be idle), this
process's CPU, and the WAL written. ``--without-batch-key`` drops the batches' foreign
key in the scratch database first, to show what that check costs.

    python -m steno.benchmarks.log_writes [--commits 400] [--responses-per-commit 8] [--rounds 2]

Postgres: STENO_DATABASE_URL, else Steno's default; the scratch database is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from steno.benchmarks.harness import group_cpu_seconds
from steno.schemas.bus import TokenBatch
from steno.schemas.events import LoggedEvent
from steno.services.common.config import Settings
from steno.services.common.migrate import database_url_named, drop_database, ensure_database, upgrade
from steno.services.parser.event_log import EventLog, ResponseWrite, create_parser_pools

SHAPES = ("events", "batches", "both", "ending")
WORDS = ("the", "log", "keeps", "every", "event", "a", "response", "streamed", "so", "that", "a", "client", "can",
         "resume")


@dataclass(frozen=True)
class Sizes:
    commits: int
    responses_per_commit: int
    events: int
    payload_bytes: int
    batches: int
    batch_tokens: int


@dataclass
class Figures:
    shape: str
    responses: int
    postgres_cpu_s: float
    client_cpu_s: float
    wal_bytes: int

    def per_response(self) -> dict[str, float]:
        return {"postgres_cpu_us": 1e6 * self.postgres_cpu_s / self.responses,
                "client_cpu_us": 1e6 * self.client_cpu_s / self.responses,
                "wal_bytes": self.wal_bytes / self.responses}


def delta_payload(seq: int, payload_bytes: int) -> str:
    """An ``output_text.delta`` event about ``payload_bytes`` long, text that compresses as prose does."""
    head = {"type": "response.output_text.delta", "item_id": "msg_" + secrets.token_hex(12), "output_index": 1,
            "content_index": 0, "logprobs": [], "sequence_number": seq}
    room = max(payload_bytes - len(orjson.dumps({**head, "delta": ""})), 1)
    words = WORDS[seq % len(WORDS):] + WORDS[:seq % len(WORDS)]
    prose = " ".join(words * (room // len(" ".join(words)) + 1))
    return orjson.dumps({**head, "delta": prose[:room]}).decode()


def final_snapshot(response_id: str, text: str) -> dict[str, Any]:
    return {"id": response_id, "object": "response", "status": "completed", "store": True, "error": None,
            "output": [{"id": "rs_" + secrets.token_hex(12), "type": "reasoning", "summary": [], "content": []},
                       {"id": "msg_" + secrets.token_hex(12), "type": "message", "role": "assistant",
                        "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]}],
            "usage": {"input_tokens": 30, "output_tokens": 150, "total_tokens": 180}}


def write_of(shape: str, response_id: str, sizes: Sizes) -> ResponseWrite:
    write = ResponseWrite(response_id)
    if shape != "batches":
        write.events = [LoggedEvent(seq=seq, type="response.output_text.delta",
                                    payload=delta_payload(seq, sizes.payload_bytes), hash=os.urandom(32))
                        for seq in range(1, sizes.events + 1)]
    if shape != "events":
        write.consumed = [TokenBatch(response_id=response_id, attempt=0, batch_no=batch_no,
                                     token_ids=[(batch_no * 7919 + i * 104729) % 200_000
                                                for i in range(sizes.batch_tokens)])
                          for batch_no in range(sizes.batches)]
    if shape == "ending":
        write.final_snapshot = final_snapshot(response_id, " ".join(WORDS * 10))
    return write


async def measure(database_url: str, sizes: Sizes, rounds: int, without_batch_key: bool) -> list[Figures]:
    """Every shape in every round, in a scratch database made and dropped here."""
    scratch = database_url_named(database_url, f"steno_logwrites_{secrets.token_hex(3)}")
    await ensure_database(scratch)
    try:
        await asyncio.to_thread(upgrade, scratch)
        pools = await create_parser_pools(scratch)
        try:
            if without_batch_key:
                await pools.planned.execute(
                    "ALTER TABLE response_tokens DROP CONSTRAINT response_tokens_response_id_fkey")
            log = EventLog(pools.planned, appends=pools.appends)
            figures = []
            for round_no in range(rounds + 1):  # the first round warms the connections and their plans up
                for shape in SHAPES:
                    commits = 2 if round_no == 0 else sizes.commits
                    measured = await _commit_all(pools.planned, log, shape, sizes, commits, f"{round_no}{shape}")
                    if round_no > 0:
                        figures.append(measured)
            return figures
        finally:
            await pools.close()
    finally:
        await drop_database(scratch)


async def _commit_all(pool: asyncpg.Pool, log: EventLog, shape: str, sizes: Sizes, commits: int, tag: str) -> Figures:
    count = commits * sizes.responses_per_commit
    ids = [f"resp_{tag}_{n}" for n in range(count)]
    # Rows as the API stores them (a small request), made before the clock starts.
    await pool.execute("""
        INSERT INTO responses (id, tenant_id, model, status, background, store, request, parse_context, base_snapshot)
        SELECT id, 'bench', 'm', 'in_progress', false, true, '{"input": "hello"}', '{}', '{}'
        FROM unnest($1::text[]) AS id""", ids)
    writes = [[write_of(shape, ids[c * sizes.responses_per_commit + r], sizes)
               for r in range(sizes.responses_per_commit)] for c in range(commits)]
    wal_before = await pool.fetchval("SELECT pg_current_wal_insert_lsn()")
    postgres_before, client_before = group_cpu_seconds("postgres"), time.process_time()
    for commit in writes:
        await log.commit(commit)
    postgres_cpu_s, client_cpu_s = group_cpu_seconds("postgres") - postgres_before, time.process_time() - client_before
    wal_bytes = await pool.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::bigint",
                                    wal_before)
    return Figures(shape, count, postgres_cpu_s, client_cpu_s, int(wal_bytes))


def report(figures: list[Figures]) -> None:
    for shape in SHAPES:
        runs = [f.per_response() for f in figures if f.shape == shape]
        postgres = ", ".join(f"{run['postgres_cpu_us']:.0f}" for run in runs)
        client = ", ".join(f"{run['client_cpu_us']:.0f}" for run in runs)
        wal = ", ".join(f"{run['wal_bytes']:,.0f}" for run in runs)
        print(f"{shape:8} per response: Postgres {postgres} µs CPU | this process {client} µs | WAL {wal} bytes",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=400)
    parser.add_argument("--responses-per-commit", type=int, default=8)
    parser.add_argument("--events", type=int, default=18, help="events per response in a commit")
    parser.add_argument("--payload-bytes", type=int, default=450)
    parser.add_argument("--batches", type=int, default=3, help="token batches per response in a commit")
    parser.add_argument("--batch-tokens", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--without-batch-key", action="store_true",
                        help="drop the batches' foreign key in the scratch database first")
    args = parser.parse_args()
    sizes = Sizes(args.commits, args.responses_per_commit, args.events, args.payload_bytes, args.batches,
                  args.batch_tokens)
    database_url = Settings.from_env().database_url
    print(f"{sizes.commits} commits of {sizes.responses_per_commit} responses, {sizes.events} events of about "
          f"{sizes.payload_bytes} bytes and {sizes.batches} batches of {sizes.batch_tokens} tokens each; foreign key "
          f"{'dropped' if args.without_batch_key else 'kept'}", flush=True)
    report(asyncio.run(measure(database_url, sizes, args.rounds, args.without_batch_key)))


if __name__ == "__main__":
    main()
