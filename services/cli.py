"""The ``steno`` command: run the whole stack or any single service."""

from __future__ import annotations

import argparse
import asyncio
import sys


def _migrate(_: argparse.Namespace) -> None:
    from services.common.config import Settings
    from services.common.migrate import ensure_database, upgrade

    url = Settings.from_env().database_url
    asyncio.run(ensure_database(url))
    upgrade(url)
    print(f"migrated {url}")


def main(argv: list[str] | None = None) -> None:
    from infra import stack
    from services.api import main as api_main
    from services.parser import main as parser_main
    from services.worker import main as worker_main

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
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
