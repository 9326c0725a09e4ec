"""``steno audit``: verify, replay, transcript (over ``STENO_DATABASE_URL``, any tenant)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime

import asyncpg

from steno.services.audit import replay as replays
from steno.services.audit import transcript as transcripts
from steno.services.audit.records import AuditRecords
from steno.services.audit.resources import BusModelFiles
from steno.services.audit.verify import summary_of, verify_response, verify_responses
from steno.services.common import db
from steno.services.common.config import Settings

# Exit statuses: 1 a log that does not verify, 2 nothing to audit by that id.
FAILED = 1
NOT_FOUND = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="{verify,replay,transcript}")
    verify = actions.add_parser(
        "verify", help="prove responses' logs: re-parse, fold, hash chain (exit 1 naming the first bad event)")
    target = verify.add_mutually_exclusive_group(required=True)
    target.add_argument("response_id", nargs="?", help="one response")
    target.add_argument("--conversation", metavar="ID", help="every response of a conversation")
    target.add_argument("--all", action="store_true", help="every stored response")
    verify.add_argument("--since", metavar="T", help="with --all: those made at or after T (ISO 8601, UTC if no zone)")
    verify.add_argument("--restore", action="store_true",
                        help="with one response: first write back events its log lacks (never overwriting one)")
    verify.set_defaults(audit=_verify)
    replay = actions.add_parser("replay", help="a response's stream as its clients received it, with stored times")
    replay.add_argument("response_id")
    replay.add_argument("--format", choices=replays.FORMATS, default="sse")
    replay.set_defaults(audit=_replay)
    transcript = actions.add_parser(
        "transcript", help="a whole conversation: a conversation's turns, or a response's previous_response_id chain")
    transcript.add_argument("id", metavar="CONVERSATION_ID|RESPONSE_ID")
    transcript.add_argument("--format", choices=transcripts.FORMATS, default="markdown")
    transcript.set_defaults(audit=_transcript)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    if args.action == "verify":
        if args.restore and args.response_id is None:
            sys.exit("steno audit verify: --restore applies to one response")
        if args.since is not None and not args.all:
            sys.exit("steno audit verify: --since applies to --all")
    sys.exit(asyncio.run(_with_resources(args)))


async def _with_resources(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    pool = await db.create_pool(settings.database_url)
    model_files = BusModelFiles(settings)
    try:
        status: int = await args.audit(args, pool, model_files)
        return status
    finally:
        await model_files.close()
        await pool.close()


async def _verify(args: argparse.Namespace, pool: asyncpg.Pool, model_files: BusModelFiles) -> int:
    if args.response_id is not None:
        verification = await verify_response(pool, args.response_id, restore=args.restore, model_files=model_files)
        if verification is None:
            print(f"no response {args.response_id}", file=sys.stderr)
            return NOT_FOUND
        print(verification.report())
        return 0 if verification.ok else FAILED
    records = AuditRecords(pool)
    if args.conversation is not None:
        conversation = await records.conversation(args.conversation)
        if conversation is None:
            print(f"no conversation {args.conversation}", file=sys.stderr)
            return NOT_FOUND
        response_ids, what = conversation.response_ids, f"conversation {args.conversation}"
    else:
        since = _instant(args.since) if args.since is not None else None
        response_ids = await records.response_ids(since)
        what = "all responses" + (f" since {since.isoformat()}" if since is not None else "")
    verifications = await verify_responses(pool, response_ids, model_files=model_files)
    for verification in verifications:
        if not verification.ok:
            print(verification.report())
    print(summary_of(verifications, what))
    return 0 if all(v.ok for v in verifications) else FAILED


async def _replay(args: argparse.Namespace, pool: asyncpg.Pool, _: BusModelFiles) -> int:
    events = await AuditRecords(pool).events(args.response_id)
    if events is None:
        print(f"no response {args.response_id}", file=sys.stderr)
        return NOT_FOUND
    sys.stdout.buffer.write(replays.replay(events, args.format))
    sys.stdout.buffer.flush()
    return 0


async def _transcript(args: argparse.Namespace, pool: asyncpg.Pool, _: BusModelFiles) -> int:
    records = AuditRecords(pool)
    if args.id.startswith("conv_"):
        conversation = await records.conversation(args.id)
        transcript = None if conversation is None else \
            transcripts.Transcript(args.id, "conversation", conversation.turns)
    else:
        turns = await records.chain(args.id)
        transcript = None if turns is None else transcripts.Transcript(args.id, "response_chain", turns)
    if transcript is None:
        print(f"no conversation or response {args.id}", file=sys.stderr)
        return NOT_FOUND
    sys.stdout.write(transcripts.render(transcript, args.format))
    return 0


def _instant(text: str) -> datetime:
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        sys.exit(f"steno audit verify: --since {text!r} is not an ISO 8601 date or time")
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
