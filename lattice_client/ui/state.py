"""The operations page's state: its client, the teams it may drain, its action
log, and the page renderer (Jinja2, autoescaped, with the CSRF token).

Every action is logged (logger ``lattice_client.ui``, level INFO) with who
did it -- the basic-auth user, or ``anonymous`` on an ``--unauthenticated``
page -- and kept in :attr:`UiState.actions` (the last :data:`ACTION_LOG`
actions of this process, shown at ``/actions``).
"""

from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from ..registry import now_ms
from .auth import Auth
from .data import fmt_age, fmt_time
from .drain import DrainTargets

logger = logging.getLogger("lattice_client.ui")

ACTION_LOG = 200
"""How many actions :attr:`UiState.actions` keeps."""

TEMPLATES = Path(__file__).with_name("templates")
STATIC = Path(__file__).with_name("static")


@dataclass
class Action:
    """One action taken on the page: when (ms), by whom, what, on which id, and how it went."""

    at_ms: int
    user: str
    action: str
    target: str
    outcome: str
    detail: str = ""


def pretty_json(value: Any) -> str:
    """``value`` as indented JSON with its characters as they are (``<`` stays
    ``<``: the templates escape it, so a tool input reads as it was given)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html"], default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["time"] = fmt_time
    env.filters["age"] = fmt_age
    env.filters["pretty"] = pretty_json
    return env


@dataclass
class UiState:
    """What every request of the page shares: the async ``client``
    (:class:`~lattice_client.async_client.AsyncLatticeClient`, on the server's
    event loop), the :class:`~lattice_client.ui.auth.Auth`, the
    :class:`~lattice_client.ui.drain.DrainTargets` and the action log."""

    client: Any
    auth: Auth
    drain: DrainTargets = field(default_factory=DrainTargets)
    actions: deque[Action] = field(default_factory=lambda: deque(maxlen=ACTION_LOG))
    templates: Environment = field(default_factory=_environment)

    def record(self, user: str, action: str, target: str, outcome: str, detail: str = "") -> Action:
        """Log one action (see the module doc) and keep it in :attr:`actions`."""
        entry = Action(now_ms(), user, action, target, outcome, detail)
        self.actions.append(entry)
        logger.info(
            "ui action by %s: %s %s -> %s%s", user, action, target, outcome, f" ({detail})" if detail else ""
        )
        return entry


def user_of(request: Request) -> str:
    """Who makes ``request`` (set by :class:`~lattice_client.ui.auth.AuthMiddleware`)."""
    return str(request.scope.get("state", {}).get("user") or "?")


def csrf_token(request: Request) -> str:
    """The CSRF token of ``request``'s forms."""
    ui: UiState = request.app.state.ui
    cookie = str(request.scope.get("state", {}).get("csrf_cookie") or "")
    return ui.auth.csrf_token(cookie, user_of(request))


async def render(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    """Template ``name`` with ``context`` plus what every page shows (user,
    key prefix, CSRF token, the number of calls waiting for a person)."""
    ui: UiState = request.app.state.ui
    try:
        waiting = len(await ui.client.runs.waits())
    except Exception:  # the page still renders; its own reads say what is wrong
        waiting = None
    html = ui.templates.get_template(name).render(
        request=request,
        user=user_of(request),
        prefix=ui.client.settings.key_prefix,
        csrf_token=csrf_token(request),
        waiting=waiting,
        now=now_ms(),
        path=request.url.path,
        **context,
    )
    return HTMLResponse(html, status_code=status_code)


__all__ = [
    "ACTION_LOG",
    "Action",
    "STATIC",
    "TEMPLATES",
    "UiState",
    "csrf_token",
    "pretty_json",
    "render",
    "user_of",
]
