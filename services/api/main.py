"""``steno api``: the HTTP front and SSE edge."""

from __future__ import annotations

import argparse
import socket
from contextlib import suppress

import uvicorn
from uvicorn.main import STARTUP_FAILURE

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
    parser.add_argument("--shared-port", type=int, default=None,
                        help="also listen on this port together with other API processes on this host (the kernel "
                             "spreads new connections over them); --port stays this process's own")


def run(args: argparse.Namespace) -> None:
    settings = ApiSettings.from_env()
    configure_logging("api", settings)
    configure_tracing("api", settings)
    limits = HttpLimits(settings.max_header_bytes, settings.header_timeout_s, settings.body_timeout_s)
    config = uvicorn.Config(create_app(settings), host=args.host, port=args.port, log_level="warning",
                            # uvicorn's own lines go through the process's log format; no access log.
                            log_config=None, access_log=False, timeout_graceful_shutdown=5,
                            timeout_keep_alive=args.keep_alive_s, http=limited_protocol(limits))
    server = uvicorn.Server(config)
    sockets = None
    if args.shared_port is not None:
        sockets = [listening(args.host, args.port), listening(args.host, args.shared_port, shared=True)]
    with suppress(KeyboardInterrupt):
        server.run(sockets)
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)


def listening(host: str, port: int, shared: bool = False) -> socket.socket:
    """A socket listening on ``host``:``port``; ``shared`` lets other processes listen on
    the same port (SO_REUSEPORT: the kernel hands each new connection to one of them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, reuse_port=shared)
    except OSError as exc:
        raise SystemExit(f"steno api: cannot listen on {host}:{port}: {exc.strerror}") from exc
