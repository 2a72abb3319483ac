"""The operations page as a Starlette app: :func:`create_app`.

Routes (every one behind :class:`~lattice_client.ui.auth.AuthMiddleware`):

==============================  ====  ===================================================
path                            verb  what
==============================  ====  ===================================================
``/``, ``/runs``                GET   recent runs, filtered by ``team`` and ``status``
``/runs/{run_id}``              GET   a run: summary, lead segments, member steps, waits, events
``/runs/{run_id}/events``       GET   its events as server-sent events (``after=`` stream id)
``/runs/{run_id}/cancel``       POST  cancel it (asks for a confirmation first)
``/mailboxes``                  GET   counts by status and oldest pending message per mailbox
``/mailbox?id=T::M``            GET   one mailbox's messages (``status=``), drain
``/mailbox/drain``              POST  drain one member (``lattice ui --drain TEAM_REF``)
``/calls``                      GET   parked calls and pending approvals
``/calls/resolve|approve|deny`` POST  decide one (asks for a confirmation first)
``/workers``                    GET   live workers; queues no live worker consumes in red
``/actions``                    GET   what was done on this page, by whom
``/static/...``                 GET   the stylesheet and the one script
==============================  ====  ===================================================

Responses carry a Content-Security-Policy that allows this site's own script
and stylesheet only (no inline script, no framing).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from .actions import approve_call, cancel_run, deny_call, drain_mailbox, resolve_call
from .auth import Auth, AuthMiddleware
from .drain import DrainTargets
from .pages import (
    actions_page,
    calls_page,
    mailbox_page,
    mailboxes_page,
    run_detail,
    run_events,
    runs_page,
    workers_page,
)
from .state import STATIC, UiState

SECURITY_HEADERS = {
    b"content-security-policy": b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    b"x-content-type-options": b"nosniff",
    b"x-frame-options": b"DENY",
    b"referrer-policy": b"same-origin",  # not no-referrer: Chromium then sends Origin: null
    b"cache-control": b"no-store",
}


class SecurityHeaders:
    """ASGI middleware adding :data:`SECURITY_HEADERS` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in SECURITY_HEADERS.items() if k not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def create_app(make_client: Callable[[], Any], auth: Auth, drain: DrainTargets | None = None) -> Starlette:
    """The page's app. ``make_client()`` builds its
    :class:`~lattice_client.async_client.AsyncLatticeClient` when the server
    starts (closed when it stops); ``auth``: who may use it; ``drain``: the
    teams it may drain (none by default)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        client = make_client()
        app.state.ui = UiState(client=client, auth=auth, drain=drain or DrainTargets())
        try:
            yield
        finally:
            await client.aclose()

    routes = [
        Route("/", runs_page),
        Route("/runs", runs_page),
        Route("/runs/{run_id}", run_detail),
        Route("/runs/{run_id}/events", run_events),
        Route("/runs/{run_id}/cancel", cancel_run, methods=["POST"]),
        Route("/mailboxes", mailboxes_page),
        Route("/mailbox", mailbox_page),
        Route("/mailbox/drain", drain_mailbox, methods=["POST"]),
        Route("/calls", calls_page),
        Route("/calls/resolve", resolve_call, methods=["POST"]),
        Route("/calls/approve", approve_call, methods=["POST"]),
        Route("/calls/deny", deny_call, methods=["POST"]),
        Route("/workers", workers_page),
        Route("/actions", actions_page),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [Middleware(SecurityHeaders), Middleware(AuthMiddleware, auth=auth)]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


__all__ = ["SECURITY_HEADERS", "SecurityHeaders", "create_app"]
