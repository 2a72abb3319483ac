"""``lattice flower``: Flower (the Celery web monitor) on the workers' app, protected.

Flower's UI and HTTP API get credentials: HTTP basic auth (``--basic-auth
USER:PASSWORD`` or ``FLOWER_BASIC_AUTH``) or Flower's OAuth (``--auth REGEX``
with ``--auth-provider`` and ``FLOWER_OAUTH2_KEY`` / ``FLOWER_OAUTH2_SECRET``
/ ``FLOWER_OAUTH2_REDIRECT_URI``). With none it refuses to start unless given
``--unauthenticated``, which serves UI and API without credentials on a
loopback address only. Credentials reach Flower through its ``FLOWER_*``
environment variables, never its command line (which other users of the
machine can read). Start-up failures (busy port, missing Flower, unknown app)
are one ``error:`` line; then this process becomes
``python -m celery -A <app> flower --address=.. --port=..``.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import socket
import sys
from typing import Annotated

import typer

from .app import command, options_of
from .output import fail, guard
from .workers import PASS_THROUGH, require_extra

FLOWER_APP = "lattice_worker.runtime.worker.celery_app:app"
"""The Celery app Flower monitors (the worker side's app, same settings)."""

OAUTH_VARIABLES = ("FLOWER_OAUTH2_KEY", "FLOWER_OAUTH2_SECRET", "FLOWER_OAUTH2_REDIRECT_URI")
"""What Flower's OAuth needs besides ``--auth``."""

_CREDENTIAL_OPTIONS = ("--basic-auth", "--basic_auth", "--auth")


def flower_argv(address: str, port: int, extra: list[str], *, celery_app: str = FLOWER_APP) -> list[str]:
    """The command ``lattice flower`` execs: ``python -m celery -A <app> flower --address=.. --port=.. <extra>``."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        celery_app,
        "flower",
        f"--address={address}",
        f"--port={port}",
        *extra,
    ]


def is_loopback(address: str) -> bool:
    """``127.0.0.0/8``, ``::1`` or ``localhost``."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def check_basic_auth(value: str) -> None:
    """Refuse anything but ``USER:PASSWORD[,USER2:PASSWORD2...]`` (never echoing a password)."""
    for entry in value.split(","):
        user, sep, password = entry.partition(":")
        if not sep or not user.strip() or not password:
            fail(
                "--basic-auth (FLOWER_BASIC_AUTH) must be USER:PASSWORD, several separated by commas; "
                f"an entry for user {user.strip()!r} has {'an empty password' if sep else 'no password'}"
            )


def check_port_free(address: str, port: int, what: str = "Flower") -> None:
    """Fail with one line when ``what`` (a server: Flower, the operations page) could not listen on ``address:port``."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((address, port))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        fail(
            f"{what} cannot listen on {address}:{port}: {reason} (is another server on that port? choose --port or --address)"
        )


@command(context_settings=PASS_THROUGH)
def flower(
    ctx: typer.Context,
    address: Annotated[
        str, typer.Option("--address", metavar="ADDRESS", help="Interface Flower listens on.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=1, max=65535, metavar="PORT", help="HTTP port of Flower.")
    ] = 5555,
    celery_app: Annotated[
        str, typer.Option("--app", metavar="MODULE:ATTRIBUTE", help="The Celery app to monitor.")
    ] = FLOWER_APP,
    basic_auth: Annotated[
        str | None,
        typer.Option(
            "--basic-auth",
            envvar="FLOWER_BASIC_AUTH",
            show_envvar=True,
            metavar="USER:PASSWORD",
            help="HTTP basic auth for the UI and the API (several: user1:pw1,user2:pw2).",
        ),
    ] = None,
    auth: Annotated[
        str | None,
        typer.Option(
            "--auth",
            envvar="FLOWER_AUTH",
            show_envvar=True,
            metavar="REGEX",
            help="OAuth: the e-mail addresses allowed in (needs FLOWER_OAUTH2_KEY, FLOWER_OAUTH2_SECRET, "
            "FLOWER_OAUTH2_REDIRECT_URI).",
        ),
    ] = None,
    auth_provider: Annotated[
        str | None,
        typer.Option(
            "--auth-provider",
            envvar="FLOWER_AUTH_PROVIDER",
            show_envvar=True,
            metavar="CLASS",
            help="OAuth: Flower's login handler, e.g. flower.views.auth.GithubLoginHandler (default: Google).",
        ),
    ] = None,
    unauthenticated: Annotated[
        bool,
        typer.Option(
            "--unauthenticated",
            help="Serve the UI and the API without credentials, on a loopback address only (127.0.0.1).",
        ),
    ] = False,
) -> None:
    """Run Flower (the Celery web monitor) on the workers' app, behind credentials.

    Give --basic-auth USER:PASSWORD (or FLOWER_BASIC_AUTH), or OAuth (--auth and
    FLOWER_OAUTH2_*); without credentials Flower does not start, unless
    --unauthenticated, which listens on 127.0.0.1 only. Flower's other options
    pass through (e.g. --url-prefix=flower), and so do FLOWER_* environment variables.
    Open http://ADDRESS:PORT in a browser; its HTTP API answers /api/workers and /api/tasks
    (with the same credentials).

    Example: FLOWER_BASIC_AUTH=ops:s3cret lattice flower --address 0.0.0.0 --port 5555
    """
    options = options_of(ctx)
    with guard():
        options.settings()
    extra = list(ctx.args)
    passed = [a for a in extra if a.partition("=")[0] in _CREDENTIAL_OPTIONS]
    if basic_auth:  # an empty FLOWER_BASIC_AUTH (compose's default) counts as none
        check_basic_auth(basic_auth)
    has_credentials = bool(basic_auth or auth or passed)
    if unauthenticated and has_credentials:
        fail(
            "--unauthenticated and credentials (--basic-auth, --auth, FLOWER_BASIC_AUTH, FLOWER_AUTH) exclude each other"
        )
    if unauthenticated and not is_loopback(address):
        fail(
            f"--unauthenticated listens on a loopback address only, not {address!r}: "
            "drop --address, or give credentials (--basic-auth USER:PASSWORD)"
        )
    if not has_credentials and not unauthenticated:
        fail(
            "Flower needs credentials: --basic-auth USER:PASSWORD (or FLOWER_BASIC_AUTH), or OAuth "
            "(--auth REGEX with FLOWER_OAUTH2_KEY, FLOWER_OAUTH2_SECRET, FLOWER_OAUTH2_REDIRECT_URI); "
            "--unauthenticated serves it without them on 127.0.0.1 only"
        )
    if auth:
        missing = [name for name in OAUTH_VARIABLES if not os.environ.get(name)]
        if missing:
            fail(f"--auth (OAuth) needs {', '.join(missing)} in the environment")
    require_extra("flower")
    if importlib.util.find_spec("flower") is None:
        fail("Flower is not installed: pip install 'agent-lattice[worker]'")
    module = celery_app.partition(":")[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        fail(f"cannot find the Celery app module {module!r} (for {celery_app})")
    check_port_free(address, port)
    options.export_env()
    for name, value in (
        ("FLOWER_BASIC_AUTH", basic_auth),
        ("FLOWER_AUTH", auth),
        ("FLOWER_AUTH_PROVIDER", auth_provider),
    ):
        if value:
            os.environ[name] = value
        else:  # an empty one would reach Flower as an option value
            os.environ.pop(name, None)
    if unauthenticated:
        os.environ["FLOWER_UNAUTHENTICATED_API"] = "true"
    else:
        os.environ.pop("FLOWER_UNAUTHENTICATED_API", None)
    argv = flower_argv(address, port, extra, celery_app=celery_app)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


__all__ = [
    "FLOWER_APP",
    "OAUTH_VARIABLES",
    "check_basic_auth",
    "check_port_free",
    "flower_argv",
    "is_loopback",
]
