"""``steno api``: the HTTP front and SSE edge."""

from __future__ import annotations

import argparse

import uvicorn

from steno.services.api.app import create_app
from steno.services.api.http_limits import HttpLimits, limited_protocol
from steno.services.common.config import ApiSettings
from steno.services.common.logs import configure_logging
from steno.services.common.tracing import configure_tracing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    # Longer than a load balancer's idle timeout (60 s on most), so the server never closes
    # a pooled connection just as a client sends its next request on it.
    parser.add_argument("--keep-alive-s", type=float, default=75.0, help="idle keep-alive connection timeout")


def run(args: argparse.Namespace) -> None:
    settings = ApiSettings.from_env()
    configure_logging("api", settings)
    configure_tracing("api", settings)
    limits = HttpLimits(settings.max_header_bytes, settings.header_timeout_s, settings.body_timeout_s)
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="warning",
                # uvicorn's own lines go through the process's log format; no access log.
                log_config=None, access_log=False,
                timeout_graceful_shutdown=5, timeout_keep_alive=args.keep_alive_s, http=limited_protocol(limits))
