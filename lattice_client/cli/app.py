"""The ``lattice`` Typer app and its global options (``--broker-url``,
``--mailbox-url``, ``--key-prefix``, ``--debug``), which go before the command.

Settings come from these options or ``LATTICE_*`` environment variables.
``--broker-url`` given alone moves the mailboxes too (their default is the
broker URL), whatever ``LATTICE_MAILBOX_URL`` says. A global option written
after the command is refused with a hint to put it first; an unknown
``LATTICE_*`` variable gets a warning naming the closest known one.

The commands live in the sibling modules by role and register themselves on
:data:`app` with :func:`command` when :mod:`lattice_client.cli` is imported.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from ..settings import LatticeSettings, get_settings, is_amqp_url, unknown_variables
from .help import HelpGroup, LatticeCommand
from .output import EXIT_USAGE, err, out, redact, state

GLOBAL_OPTIONS = ("--broker-url", "--mailbox-url", "--key-prefix", "--debug")
"""Options of ``lattice`` itself: they go before the command."""

DEBUG_ENV = "LATTICE_DEBUG"
"""``LATTICE_DEBUG=1`` does what ``--debug`` does."""


class LatticeGroup(HelpGroup):
    """The ``lattice`` group: refuses a global option given after the command
    with a hint to put it first (one ``error:`` line, exit code 2 as for other usage errors)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            typer.echo(ctx.get_help())  # typer's rich mode would print nothing for our help
            raise typer.Exit(EXIT_USAGE)
        rest = super().parse_args(ctx, args)
        command = args[len(args) - len(rest) - 1] if len(rest) < len(args) else ""
        for index, arg in enumerate(rest):
            if arg == "--":
                break
            name = arg.partition("=")[0]
            if name in GLOBAL_OPTIONS:
                value = "" if name == "--debug" else (arg.partition("=")[2] or _next(rest, index) or "VALUE")
                shown = f"{name} {value}".strip()
                err.print(
                    f"error: {name} is an option of lattice itself: put {name} before the command, "
                    f"e.g. lattice {redact(shown)} {command} ...",
                    markup=False,
                )
                raise typer.Exit(EXIT_USAGE)
        return rest


def _next(args: list[str], index: int) -> str | None:
    following = args[index + 1] if index + 1 < len(args) else None
    return following if following is not None and not following.startswith("-") else None


app = typer.Typer(
    name="lattice",
    cls=LatticeGroup,
    help=(
        "agent-lattice: run teams of LLM agents on Celery workers over Redis.\n\n"
        "Start workers with 'lattice worker', submit work with 'lattice submit', "
        "watch with 'lattice status', 'lattice ui' (the operations page) or 'lattice flower'. "
        "Settings come from the options below or LATTICE_* environment variables "
        "(LATTICE_BROKER_URL, LATTICE_MAILBOX_URL, LATTICE_KEY_PREFIX, LATTICE_LEASE_SECONDS, LATTICE_MAX_ATTEMPTS, "
        "LATTICE_MAX_MESSAGE_BYTES, ...); the options go before the command, "
        "e.g. lattice --key-prefix staging status."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)

command = functools.partial(app.command, cls=LatticeCommand)
"""``@command()`` registers a ``lattice`` command whose help reads as typed."""


@dataclass
class Options:
    """The global options as given on the command line (``None`` = not given:
    the environment decides). ``--broker-url`` alone also sets the mailbox URL
    (a Redis one: with an ``amqp://`` broker the mailboxes stay where
    ``--mailbox-url`` or ``LATTICE_MAILBOX_URL`` says)."""

    broker_url: str | None = None
    mailbox_url: str | None = None
    key_prefix: str | None = None
    debug: bool = False

    def overrides(self) -> dict[str, str]:
        pairs = {
            "broker_url": self.broker_url,
            "mailbox_url": self.mailbox_url if self.mailbox_url is not None else self.following_mailbox(),
            "key_prefix": self.key_prefix,
        }
        return {k: v for k, v in pairs.items() if v is not None}

    def following_mailbox(self) -> str | None:
        """The mailbox URL ``--broker-url`` alone implies: the broker's when it
        is Redis, ``None`` (the environment decides) when it is RabbitMQ or not given."""
        return None if self.broker_url is None or is_amqp_url(self.broker_url) else self.broker_url

    def settings(self) -> LatticeSettings:
        return get_settings(**self.overrides())

    def export_env(self) -> None:
        """Hand the global options to the worker side (it reads LATTICE_* itself)."""
        for name, value in self.overrides().items():
            os.environ[f"LATTICE_{name.upper()}"] = value

    def argv(self) -> list[str]:
        """The global options as typed before a command (URLs without their password)."""
        given = [("--broker-url", self.broker_url), ("--mailbox-url", self.mailbox_url)]
        words = [f"{name} {redact(value)}" for name, value in given if value is not None]
        if self.key_prefix is not None:
            words.append(f"--key-prefix {self.key_prefix}")
        return words


def options_of(ctx: typer.Context) -> Options:
    """The global options of the command running in ``ctx``."""
    obj = ctx.find_root().obj
    return obj if isinstance(obj, Options) else Options()


def _typed(ctx: typer.Context, name: str, value: str | None) -> str | None:
    # the value when it was given on the command line (the environment is read by the settings)
    source = ctx.get_parameter_source(name)
    return value if source is not None and source.name == "COMMANDLINE" else None


@app.callback()
def _main(
    ctx: typer.Context,
    broker_url: Annotated[
        str | None,
        typer.Option(
            "--broker-url",
            envvar="LATTICE_BROKER_URL",
            metavar="URL",
            help="URL of the Celery broker: Redis (also run records and events) or RabbitMQ (amqp://) "
            "(default: redis://127.0.0.1:6379/0, the port from LATTICE_REDIS_PORT). "
            "A Redis URL given alone moves the mailboxes too.",
            show_envvar=True,
        ),
    ] = None,
    mailbox_url: Annotated[
        str | None,
        typer.Option(
            "--mailbox-url",
            envvar="LATTICE_MAILBOX_URL",
            metavar="URL",
            help="Where the mailboxes live (redis://, sqlite:///, postgresql://) (default: the broker URL; "
            "with an amqp:// broker a Redis URL, required, that holds runs and events too).",
            show_envvar=True,
        ),
    ] = None,
    key_prefix: Annotated[
        str | None,
        typer.Option(
            "--key-prefix",
            envvar="LATTICE_KEY_PREFIX",
            metavar="PREFIX",
            help="Prefix of every Redis key and queue name; deployments with different prefixes never meet (default: lattice).",
            show_envvar=True,
        ),
    ] = None,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            envvar=DEBUG_ENV,
            help="On an error, print its traceback too (e.g. of an exception in your team module).",
            show_envvar=True,
        ),
    ] = False,
) -> None:
    options = Options(
        broker_url=_typed(ctx, "broker_url", broker_url),
        mailbox_url=_typed(ctx, "mailbox_url", mailbox_url),
        key_prefix=_typed(ctx, "key_prefix", key_prefix),
        debug=debug,
    )
    ctx.obj = options
    state.debug = debug
    out.renew()  # this command's width (COLUMNS now, not at import)
    err.renew()
    for name, close in unknown_variables(os.environ):
        hint = f" (did you mean {close}?)" if close else ""
        err.print(f"warning: {name} is not a lattice setting and is ignored{hint}", markup=False)
    exported = os.environ.get("LATTICE_MAILBOX_URL")
    if options.following_mailbox() is not None and options.mailbox_url is None and exported not in (None, ""):
        if exported != options.broker_url:
            err.print(
                "note: --broker-url also moves the mailboxes there (LATTICE_MAILBOX_URL is not used); "
                "give --mailbox-url to keep them apart",
                markup=False,
            )


def client_for(options: Options) -> Any:
    """A :class:`~lattice_client.client.LatticeClient` on the settings of ``options``."""
    from ..cli_logging import show_client_warnings
    from ..client import LatticeClient

    show_client_warnings(err)
    return LatticeClient(settings=options.settings())


__all__ = [
    "DEBUG_ENV",
    "GLOBAL_OPTIONS",
    "LatticeGroup",
    "Options",
    "app",
    "client_for",
    "command",
    "options_of",
]
