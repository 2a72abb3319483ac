"""``lattice ui``: the operations page (:mod:`lattice_client.ui`), behind credentials.

Auth works as for ``lattice flower``: HTTP basic auth (``--basic-auth
USER:PASSWORD`` or ``LATTICE_UI_BASIC_AUTH``, several users separated by
commas); with none the page does not start unless ``--unauthenticated``,
which serves it without credentials on a loopback address only. ``--drain
TEAM_REF`` (repeatable) lets the page drain that team's members in its own
process (it imports the team: the ``worker`` extra). Start-up failures (busy
port, missing extra, bad credentials, a team that does not import) are one
``error:`` line.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from typing import Annotated

import typer

from .app import command, options_of
from .flower import check_port_free, is_loopback
from .output import err, fail, guard
from .workers import require_extra

UI_EXTRA = "ui"
"""The extra of the page: ``pip install 'agent-lattice[ui]'``."""

DEFAULT_PORT = 8470
"""Where ``lattice ui`` listens unless given ``--port``."""

_MODULES = ("starlette", "jinja2", "uvicorn", "multipart")


@command("ui")
def ui(
    ctx: typer.Context,
    address: Annotated[
        str, typer.Option("--address", metavar="ADDRESS", help="Interface the page listens on.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=1, max=65535, metavar="PORT", help="HTTP port of the page.")
    ] = DEFAULT_PORT,
    basic_auth: Annotated[
        str | None,
        typer.Option(
            "--basic-auth",
            envvar="LATTICE_UI_BASIC_AUTH",
            show_envvar=True,
            metavar="USER:PASSWORD",
            help="HTTP basic auth for the page (several: user1:pw1,user2:pw2).",
        ),
    ] = None,
    unauthenticated: Annotated[
        bool,
        typer.Option(
            "--unauthenticated",
            help="Serve the page without credentials, on a loopback address only (127.0.0.1).",
        ),
    ] = False,
    drain: Annotated[
        list[str] | None,
        typer.Option(
            "--drain",
            metavar="TEAM_REF",
            help="Offer drain for this team's mailboxes (repeatable; 'package.module:attribute': "
            "the team is imported here and needs the worker extra).",
        ),
    ] = None,
) -> None:
    """Serve the operations page: runs, mailboxes, parked calls, approvals, workers and queues.

    Give --basic-auth USER:PASSWORD (or LATTICE_UI_BASIC_AUTH); without
    credentials the page does not start, unless --unauthenticated, which
    listens on 127.0.0.1 only. Open http://ADDRESS:PORT in a browser. Every
    action (cancel, resolve, approve, deny, drain) asks for a confirmation and
    is logged with who did it.

    Example: LATTICE_UI_BASIC_AUTH=ops:s3cret lattice ui --address 0.0.0.0 --port 8470
    """
    options = options_of(ctx)
    with guard():
        settings = options.settings()
    users: dict[str, str] = {}
    if basic_auth:  # an empty LATTICE_UI_BASIC_AUTH counts as none
        from ..ui.auth import parse_basic_auth

        try:
            users = parse_basic_auth(basic_auth)
        except ValueError as exc:
            fail(str(exc))
    if unauthenticated and users:
        fail("--unauthenticated and credentials (--basic-auth, LATTICE_UI_BASIC_AUTH) exclude each other")
    if unauthenticated and not is_loopback(address):
        fail(
            f"--unauthenticated listens on a loopback address only, not {address!r}: "
            "drop --address, or give credentials (--basic-auth USER:PASSWORD)"
        )
    if not users and not unauthenticated:
        fail(
            "the operations page needs credentials: --basic-auth USER:PASSWORD (or LATTICE_UI_BASIC_AUTH); "
            "--unauthenticated serves it without them on 127.0.0.1 only"
        )
    require_extra("ui", UI_EXTRA)
    missing = [name for name in _MODULES if importlib.util.find_spec(name) is None]
    if missing:
        fail(
            f"lattice ui needs the ui extra: pip install 'agent-lattice[ui]' (missing: {', '.join(missing)})"
        )
    options.export_env()  # drain's worker side reads LATTICE_* itself
    from ..ui.drain import load_targets

    if drain:
        require_extra("ui --drain")
    with guard():
        targets = load_targets(list(drain or []))
    check_port_free(address, port, "the operations page")
    serve(address, port, settings, users, targets)


def serve(address: str, port: int, settings: object, users: dict[str, str], targets: object) -> None:
    """Run the page with uvicorn until interrupted (the action log goes to stderr)."""
    import uvicorn

    from ..async_client import AsyncLatticeClient
    from ..ui import Auth, create_app

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("lattice_client.ui")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    app = create_app(lambda: AsyncLatticeClient(settings=settings), Auth(users), targets)  # type: ignore[arg-type]
    who = f"user(s) {', '.join(sorted(users))}" if users else "no credentials (loopback only)"
    err.print(f"lattice ui on http://{address}:{port}/ ({who}); Ctrl-C stops it", markup=False)
    # open event streams (a run's page) do not hold a stop up for long
    uvicorn.run(
        app,
        host=address,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=3,
    )


__all__ = ["DEFAULT_PORT", "UI_EXTRA", "serve"]
