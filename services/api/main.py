"""``steno api``: the HTTP front and SSE edge."""

from __future__ import annotations

import argparse

import uvicorn

from services.api.app import create_app
from services.common.runtime import configure_logging


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)


def run(args: argparse.Namespace) -> None:
    configure_logging("api")
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=5)
