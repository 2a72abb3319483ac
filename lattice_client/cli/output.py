"""Output helpers of the ``lattice`` command: the consoles, the one-line
``error:`` exit, the guard that turns expected failures into it, and the
printing of a run's result.

Bad input or an unreachable Redis prints one ``error: ...`` line on stderr and
exits with a non-zero code (:data:`EXIT_ERROR`, :data:`EXIT_TIMEOUT`); the
traceback only with ``--debug`` (``LATTICE_DEBUG=1``). No message shows a
URL's password (:func:`redact`).
"""

from __future__ import annotations

import contextlib
import json
import math
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from lattice_mailbox.urls import redact_urls

EXIT_ERROR = 1
"""Exit code of a failed command (bad input, unknown run, Redis unreachable, failed run)."""

EXIT_TIMEOUT = 3
"""Exit code when ``--timeout`` passed before the run finished."""

EXIT_USAGE = 2
"""Exit code of a command line that cannot be parsed (as typer's own usage errors)."""

EXIT_INTERRUPTED = 130
"""Exit code after Ctrl-C."""


@dataclass
class State:
    """What the global options say about output: ``debug`` prints tracebacks."""

    debug: bool = False


state = State()
"""Set by the ``lattice`` callback for the command being run."""


class CommandConsole:
    """A ``rich.console.Console`` made again for each ``lattice`` command
    (:meth:`renew`, called by the command's callback); every other attribute is
    the console's. Rich fixes a console's width from ``COLUMNS`` when the console
    is made, and one process can run many commands (typer's ``CliRunner``, a
    service that embeds the CLI): each command's tables then fit the width its
    own environment gives, not the one at import."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console = Console(**options)

    def renew(self) -> None:
        """Make the console again, reading ``COLUMNS`` / the terminal's size now."""
        self._console = Console(**self._options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._console, name)


out = CommandConsole(highlight=False, soft_wrap=True)
err = CommandConsole(stderr=True, highlight=False, soft_wrap=True)


def redact(text: str) -> str:
    """``text`` with the password of every URL in it masked."""
    return redact_urls(text)


def fail(message: str, code: int = EXIT_ERROR, *, exc: BaseException | None = None) -> NoReturn:
    """Print ``error: <message>`` (one line, URL passwords masked) on stderr and exit
    with ``code``; with ``--debug``, ``exc``'s traceback (its causes too) first."""
    if exc is not None and state.debug:
        text = "".join(traceback.format_exception(exc))
        err.print(redact(text.rstrip()), markup=False, highlight=False)
    elif exc is not None and exc.__cause__ is not None:  # e.g. an exception in a team module
        message += " (--debug shows the traceback)"
    line = escape(redact(" ".join(message.split())))  # [brackets] in a message are text, not markup
    err.print(f"[red]error:[/red] {line}", markup=True, highlight=False)
    raise typer.Exit(code)


_SETTING_SOURCES = {
    "broker_url": "LATTICE_BROKER_URL or --broker-url",
    "mailbox_url": "LATTICE_MAILBOX_URL or --mailbox-url",
    "key_prefix": "LATTICE_KEY_PREFIX or --key-prefix",
}
"""Where a setting the ``lattice`` command also takes as an option comes from."""


def describe(exc: BaseException) -> str:
    """A one-line description of ``exc`` (pydantic validation errors: ``field: message; ...``)."""
    if isinstance(exc, ValidationError):
        parts = []
        for error in exc.errors():
            path = [str(x) for x in error.get("loc", ())]
            loc = ".".join(path)
            if loc and exc.title == "LatticeSettings":  # name the variable (or option) that sets it
                # the setting's own variable: a field inside its JSON value (model_limits.*.x) is no variable
                loc = f"{loc} ({_SETTING_SOURCES.get(path[0], f'LATTICE_{path[0].upper()}')})"
            msg = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}" if loc else msg)
        return "invalid settings: " + "; ".join(parts)
    text = str(exc) or type(exc).__name__
    return text


@contextlib.contextmanager
def guard() -> Iterator[None]:
    """Turn expected failures into one ``error:`` line and an exit code."""
    from kombu.exceptions import OperationalError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    try:
        yield
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (RedisConnectionError, RedisTimeoutError, OperationalError) as exc:
        fail(f"cannot reach Redis: {describe(exc)}", exc=exc)
    except RedisError as exc:
        fail(f"Redis error: {describe(exc)}", exc=exc)
    except TimeoutError as exc:
        fail(describe(exc), EXIT_TIMEOUT, exc=exc)
    except (ValueError, LookupError, ImportError, OSError, TypeError) as exc:
        fail(describe(exc), exc=exc)
    except Exception as exc:  # never a traceback for a user (unless --debug)
        database = _database_error(exc)
        if database is not None:
            fail(f"mailbox database error (LATTICE_MAILBOX_URL or --mailbox-url): {database}", exc=exc)
        fail(f"{type(exc).__name__}: {describe(exc)}", exc=exc)


def _database_error(exc: BaseException) -> str | None:
    """The driver's own message of an SQL mailbox's database error (SQLAlchemy's
    ``DBAPIError``: cannot connect, refused, locked, ...), else ``None``."""
    try:
        from sqlalchemy.exc import DBAPIError
    except ImportError:  # a thin install without the sql extra has no SQL mailbox
        return None
    if not isinstance(exc, DBAPIError):
        return None
    return " ".join(str(exc.orig if exc.orig is not None else exc).split())


def print_result(result: Any, as_json: bool) -> int:
    """Print a :class:`~lattice_client.models.RunResult`; returns the exit code it means."""
    if as_json:
        out.print_json(result.model_dump_json())
    else:
        colour = {"completed": "green", "failed": "red", "cancelled": "yellow"}.get(result.status, "white")
        out.print(f"run [bold]{result.run_id}[/bold]: [{colour}]{result.status}[/{colour}]", markup=True)
        if result.result:
            out.print(result.result, markup=False)
        if result.structured_result is not None:
            out.print_json(json.dumps(result.structured_result, default=str))
        if result.error:
            out.print(f"error: {result.error}", markup=False)
        if result.usage:
            out.print(f"usage: {json.dumps(result.usage, default=str)}", markup=False, style="dim")
        for entry in getattr(result, "failed_work_items", None) or []:
            out.print(f"warning: {describe_failed_item(entry)}", markup=False, style="yellow")
    return 0 if result.status == "completed" else EXIT_ERROR


def describe_failed_item(entry: dict[str, Any]) -> str:
    """``work item <id> of member "<name>" failed (<code>): <message>``."""
    error = entry.get("error") or {}
    code = f" ({error['code']})" if error.get("code") else ""
    detail = " ".join(str(error.get("message") or entry.get("content") or "").split())
    return f'work item {entry.get("work_item_id")} of member "{entry.get("member")}" {entry.get("status")}{code}: {detail}'


def check_timeout(timeout: float | None) -> None:
    """Refuse a negative or NaN ``--timeout`` (``inf``: no limit)."""
    if timeout is not None and (math.isnan(timeout) or timeout < 0):
        fail(f"--timeout must be >= 0 seconds (or inf: no limit), got {timeout}")


__all__ = [
    "EXIT_ERROR",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "check_timeout",
    "describe",
    "err",
    "fail",
    "guard",
    "out",
    "print_result",
]
