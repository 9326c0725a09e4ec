"""Counts the API's requests by method, route template and status (never the path
itself: ids in paths would make a series per response)."""

from __future__ import annotations

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from steno.services.common.metrics import API_REQUESTS, mark_request_arrived

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# The route of a request that matches none of the app's routes.
UNMATCHED = "unmatched"


def route_template(scope: Scope) -> str:
    """The template of the route that served (or would serve) the request."""
    route = scope.get("route")
    if route is None:
        # Answered before routing (authentication, the body limit): the route it was for.
        for candidate in scope["app"].router.routes:
            if candidate.matches(scope)[0] == Match.FULL:
                route = candidate
                break
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


class RequestMetrics:
    """Outermost: every answer is counted when its status is sent; a request that fails
    before answering counts as the 500 the server then sends. It also marks when the
    request arrived, for the latencies measured from then."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        mark_request_arrived()
        answered = False

        async def counting_send(message: Message) -> None:
            nonlocal answered
            if message["type"] == "http.response.start" and not answered:
                answered = True
                _count(scope, message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except BaseException:
            if not answered:
                _count(scope, 500)
            raise


def _count(scope: Scope, status: int) -> None:
    method = scope["method"] if scope["method"] in _METHODS else "OTHER"
    API_REQUESTS.labels(method, route_template(scope), str(status)).inc()
