"""The ``steno`` command: run the whole stack or any single service."""

from __future__ import annotations

import argparse
import asyncio
import sys


def _migrate(_: argparse.Namespace) -> None:
    from steno.services.common.config import Settings
    from steno.services.common.migrate import ensure_database, upgrade

    url = Settings.from_env().database_url
    asyncio.run(ensure_database(url))
    upgrade(url)
    print(f"migrated {url}")


def _audit(args: argparse.Namespace) -> None:
    from steno.services.common import bus, db
    from steno.services.common.config import Settings
    from steno.services.common.model_files import ensure_model_files
    from steno.services.parser.audit import audit

    async def run() -> bool:
        settings = Settings.from_env()
        pool = await db.create_pool(settings.database_url)

        async def fetch_model_files(digest: str) -> None:
            nc = await bus.connect(settings, "steno-audit", max_reconnect_attempts=0)
            try:
                await ensure_model_files(nc.jetstream(), bus.Names.from_settings(settings), digest)
            finally:
                await nc.close()

        try:
            result = await audit(pool, args.response_id, restore=args.restore, fetch_model_files=fetch_model_files)
        finally:
            await pool.close()
        if result.identical:
            print(f"{args.response_id}: re-parse is byte-identical to the log ({len(result.stored)} parser events)")
            return True
        print(f"{args.response_id}: re-parse differs from the log from seq {result.first_difference()} "
              f"({len(result.reparsed)} re-parsed, {len(result.stored)} stored)")
        return False

    sys.exit(0 if asyncio.run(run()) else 1)


def _keys(args: argparse.Namespace) -> None:
    from steno.services.api import keys
    from steno.services.common import db
    from steno.services.common.config import Settings

    async def run() -> int:
        pool = await db.create_pool(Settings.from_env().database_url)
        try:
            if args.action == "create":
                created = await keys.create_key(pool, args.tenant, args.name)
                print(f"created {created.key_id} for tenant {created.tenant_id}; the key (shown only now):")
                print(created.key)
            elif args.action == "revoke":
                if not await keys.revoke_key(pool, args.key_id):
                    print(f"no active key {args.key_id}", file=sys.stderr)
                    return 1
                print(f"revoked {args.key_id}")
            else:
                for row in await keys.list_keys(pool):
                    state = f"revoked {row['revoked_at']:%Y-%m-%d}" if row["revoked_at"] else "active"
                    print(f"{row['id']}  tenant={row['tenant_id']}  name={row['name'] or '-'}  {state}")
            return 0
        finally:
            await pool.close()

    sys.exit(asyncio.run(run()))


def _reasoning_keys(args: argparse.Namespace) -> None:
    from steno.services.common import db, reasoning_keys
    from steno.services.common.config import Settings

    if args.action == "generate":
        # For STENO_REASONING_KEYS: nothing is stored.
        print(reasoning_keys.setting_for(reasoning_keys.new_key()))
        return

    async def run() -> int:
        pool = await db.create_pool(Settings.from_env().database_url)
        try:
            if args.action == "rotate":
                print(f"{await reasoning_keys.rotate(pool)} seals new responses' reasoning from now on")
            elif args.action == "retire":
                if not await reasoning_keys.retire(pool, args.key_id):
                    print(f"no active reasoning key {args.key_id}", file=sys.stderr)
                    return 1
                print(f"retired {args.key_id}: what it sealed no longer opens")
            else:
                for row in await reasoning_keys.list_keys(pool):
                    state = f"retired {row['retired_at']:%Y-%m-%d}" if row["retired_at"] else "active"
                    print(f"{row['id']}  created {row['created_at']:%Y-%m-%d %H:%M}  {state}")
            return 0
        finally:
            await pool.close()

    sys.exit(asyncio.run(run()))


def main(argv: list[str] | None = None) -> None:
    from steno.benchmarks import command as bench_command
    from steno.infra import stack
    from steno.services.api import main as api_main
    from steno.services.parser import main as parser_main
    from steno.services.worker import main as worker_main

    parser = argparse.ArgumentParser(prog="steno", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="run the whole stack (embedded NATS/Postgres when none is found)")
    stack.add_arguments(up)
    up.set_defaults(run=stack.run)
    api = commands.add_parser("api", help="run the HTTP API with the SSE edge")
    api_main.add_arguments(api)
    api.set_defaults(run=api_main.run)
    worker = commands.add_parser("worker", help="run a generation worker")
    worker_main.add_arguments(worker)
    worker.set_defaults(run=worker_main.run)
    commands.add_parser("parser", help="run a parser").set_defaults(run=parser_main.run)
    commands.add_parser("migrate", help="create/upgrade the database schema").set_defaults(run=_migrate)
    keys = commands.add_parser("keys", help="create, revoke and list API keys")
    key_actions = keys.add_subparsers(dest="action", required=True)
    create = key_actions.add_parser("create", help="create a key for a tenant (printed once)")
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", default="")
    key_actions.add_parser("revoke", help="revoke a key").add_argument("key_id")
    key_actions.add_parser("list", help="list keys (never the keys themselves)")
    keys.set_defaults(run=_keys)
    sealing = commands.add_parser("reasoning-keys", help="the keys that seal reasoning for stateless clients")
    sealing_actions = sealing.add_subparsers(dest="action", required=True)
    sealing_actions.add_parser("rotate", help="add a newer key (older ones still open what they sealed)")
    sealing_actions.add_parser("retire", help="retire a key: what it sealed no longer opens").add_argument("key_id")
    sealing_actions.add_parser("list", help="list the keys (never the secrets)")
    sealing_actions.add_parser("generate", help="print a new key for STENO_REASONING_KEYS (stores nothing)")
    sealing.set_defaults(run=_reasoning_keys)
    bench = commands.add_parser("bench", help="benchmark the pipeline against an in-process server "
                                "(needs the bench extra)")
    bench_command.add_arguments(bench)
    bench.set_defaults(run=bench_command.run)
    audit = commands.add_parser("audit", help="re-parse a response from its stored tokens and compare with its log")
    audit.add_argument("response_id")
    audit.add_argument("--restore", action="store_true", help="write back events missing from the log")
    audit.set_defaults(run=_audit)
    args = parser.parse_args(argv)
    from steno.services.common.nats_options import NatsRefused, NatsSettingsError

    try:
        args.run(args)
    except (NatsSettingsError, NatsRefused) as exc:
        # Configuration to fix, not a bug: one line that names it, no traceback.
        print(f"steno {args.command}: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
