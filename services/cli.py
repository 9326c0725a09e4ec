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


def _retention_days(text: str) -> int:
    from steno.schemas.api import MAX_RETENTION_DAYS

    if not (text.isascii() and text.isdigit() and 0 < int(text) <= MAX_RETENTION_DAYS):
        raise argparse.ArgumentTypeError(f"a whole number of days, 1 to {MAX_RETENTION_DAYS}")
    return int(text)


def _retention(args: argparse.Namespace) -> None:
    from steno.services.api import retention
    from steno.services.api.store import ResponseStore
    from steno.services.common import db
    from steno.services.common.config import Settings

    async def run() -> int:
        pool = await db.create_pool(Settings.from_env().database_url)
        try:
            tenant: str = retention.DEFAULT_POLICY if getattr(args, "default", False) else getattr(args, "tenant", "")
            named = "every tenant without a policy of its own" if tenant == retention.DEFAULT_POLICY \
                else f"tenant {tenant}"
            if args.action == "set":
                await retention.set_policy(pool, tenant, args.days)
                print(f"{named}: what is stored from now on is kept {args.days} days")
            elif args.action == "clear":
                if not await retention.clear_policy(pool, tenant):
                    print(f"no policy for {named}", file=sys.stderr)
                    return 1
                print(f"{named}: no policy of its own any more")
            elif args.action == "sweep":
                swept = await retention.RetentionSweeper(pool, ResponseStore(pool)).sweep()
                print(f"deleted {swept.conversations} expired conversations and {swept.responses} expired responses;"
                      f" compacted the events of {swept.compacted} ended responses")
            else:
                for policy_tenant, days in await retention.list_policies(pool):
                    print(f"{'default' if policy_tenant == retention.DEFAULT_POLICY else policy_tenant}  {days} days")
            return 0
        finally:
            await pool.close()

    sys.exit(asyncio.run(run()))


def _asyncapi(args: argparse.Namespace) -> None:
    from steno.services.common.bus_contract import asyncapi_document, render

    sys.stdout.write(render(asyncapi_document(args.namespace)))


def main(argv: list[str] | None = None) -> None:
    from steno.benchmarks import command as bench_command
    from steno.infra import stack
    from steno.schemas.api import MAX_RETENTION_DAYS
    from steno.services import audit as audit_command
    from steno.services.api import main as api_main
    from steno.services.api import tenants as tenants_command
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
    parser_command = commands.add_parser("parser", help="run a parser")
    parser_main.add_arguments(parser_command)
    parser_command.set_defaults(run=parser_main.run)
    commands.add_parser("migrate", help="create/upgrade the database schema").set_defaults(run=_migrate)
    asyncapi = commands.add_parser("asyncapi", help="print the bus contract (AsyncAPI); "
                                   "`steno asyncapi > docs/asyncapi.json` regenerates the committed copy")
    asyncapi.add_argument("--namespace", default="steno", help="the deployment's STENO_NAMESPACE")
    asyncapi.set_defaults(run=_asyncapi)
    keys = commands.add_parser("keys", help="create, revoke and list API keys")
    key_actions = keys.add_subparsers(dest="action", required=True)
    create = key_actions.add_parser("create", help="create a key for a tenant (printed once)")
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", default="")
    key_actions.add_parser("revoke", help="revoke a key").add_argument("key_id")
    key_actions.add_parser("list", help="list keys (never the keys themselves)")
    keys.set_defaults(run=_keys)
    retention = commands.add_parser("retention", help="how long stored responses and conversations are kept")
    retention_actions = retention.add_subparsers(dest="action", required=True)
    for action, what in (("set", "keep what is stored from now on this many days"), ("clear", "remove a policy")):
        policy = retention_actions.add_parser(action, help=what)
        whose = policy.add_mutually_exclusive_group(required=True)
        whose.add_argument("--tenant", help="one tenant's policy")
        whose.add_argument("--default", action="store_true", help="the policy of tenants without one")
        if action == "set":
            policy.add_argument("--days", type=_retention_days, required=True, metavar=f"1..{MAX_RETENTION_DAYS}")
    retention_actions.add_parser("list", help="the policies")
    retention_actions.add_parser("sweep", help="delete what has expired now (the API does it every 30 s)")
    retention.set_defaults(run=_retention)
    sealing = commands.add_parser("reasoning-keys", help="the keys that seal reasoning for stateless clients")
    sealing_actions = sealing.add_subparsers(dest="action", required=True)
    sealing_actions.add_parser("rotate", help="add a newer key (older ones still open what they sealed)")
    sealing_actions.add_parser("retire", help="retire a key: what it sealed no longer opens").add_argument("key_id")
    sealing_actions.add_parser("list", help="list the keys (never the secrets)")
    sealing_actions.add_parser("generate", help="print a new key for STENO_REASONING_KEYS (stores nothing)")
    sealing.set_defaults(run=_reasoning_keys)
    tenants = commands.add_parser("tenants", help="tenants' quotas: requests and tokens per minute, concurrency")
    tenants_command.add_arguments(tenants)
    tenants.set_defaults(run=tenants_command.run)
    bench = commands.add_parser("bench", help="benchmark the pipeline against an in-process server "
                                "(needs the bench extra)")
    bench_command.add_arguments(bench)
    bench.set_defaults(run=bench_command.run)
    audit = commands.add_parser("audit", help="verify, replay and transcribe stored responses and conversations")
    audit_command.add_arguments(audit)
    args = parser.parse_args(argv)
    import asyncpg
    from pydantic import ValidationError

    from steno.services.common.config import describe_invalid
    from steno.services.common.nats_options import NatsRefused, NatsSettingsError

    try:
        args.run(args)
    except (NatsSettingsError, NatsRefused) as exc:
        # Configuration to fix, not a bug: one line that names it, no traceback.
        print(f"steno {args.command}: {exc}", file=sys.stderr)
        sys.exit(2)
    except ValidationError as exc:
        for line in describe_invalid(exc):
            print(f"steno {args.command}: {line}", file=sys.stderr)
        sys.exit(2)
    except (asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError) as exc:
        # A database never migrated, or migrated by an older release.
        print(f"steno {args.command}: the database is not at this release's schema ({exc}); run `steno migrate`",
              file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
