"""The ``lattice`` Typer app and its global options (``--broker-url``,
``--mailbox-url``, ``--key-prefix``), which go before the command.

Settings come from these options or ``LATTICE_*`` environment variables. The
commands live in the sibling modules by role and register themselves on
:data:`app` when :mod:`lattice_client.cli` is imported.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from ..settings import LatticeSettings, get_settings

app = typer.Typer(
    name="lattice",
    help=(
        "agent-lattice: run teams of LLM agents on Celery workers over Redis.\n\n"
        "Start workers with [bold]lattice worker[/bold], submit work with [bold]lattice submit[/bold], "
        "watch with [bold]lattice status[/bold] / [bold]lattice flower[/bold]. "
        "Settings come from the options below or LATTICE_* environment variables "
        "(LATTICE_BROKER_URL, LATTICE_MAILBOX_URL, LATTICE_KEY_PREFIX, LATTICE_LEASE_SECONDS, LATTICE_MAX_ATTEMPTS); "
        "the options go before the command, e.g. [bold]lattice --key-prefix staging status[/bold]."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)


@dataclass
class Options:
    """The global options as given (``None`` = not given: the environment decides)."""

    broker_url: str | None = None
    mailbox_url: str | None = None
    key_prefix: str | None = None

    def overrides(self) -> dict[str, str]:
        pairs = {
            "broker_url": self.broker_url,
            "mailbox_url": self.mailbox_url,
            "key_prefix": self.key_prefix,
        }
        return {k: v for k, v in pairs.items() if v is not None}

    def settings(self) -> LatticeSettings:
        return get_settings(**self.overrides())

    def export_env(self) -> None:
        """Hand the global options to the worker side (it reads LATTICE_* itself)."""
        for name, value in self.overrides().items():
            os.environ[f"LATTICE_{name.upper()}"] = value


def options_of(ctx: typer.Context) -> Options:
    """The global options of the command running in ``ctx``."""
    obj = ctx.find_root().obj
    return obj if isinstance(obj, Options) else Options()


@app.callback()
def _main(
    ctx: typer.Context,
    broker_url: Annotated[
        str | None,
        typer.Option(
            "--broker-url",
            envvar="LATTICE_BROKER_URL",
            help="Redis URL of the Celery broker, run records and events (default: redis://127.0.0.1:6379/0).",
            show_envvar=True,
        ),
    ] = None,
    mailbox_url: Annotated[
        str | None,
        typer.Option(
            "--mailbox-url",
            envvar="LATTICE_MAILBOX_URL",
            help="Where the mailboxes live (redis://, sqlite:///, postgresql://) (default: the broker URL).",
            show_envvar=True,
        ),
    ] = None,
    key_prefix: Annotated[
        str | None,
        typer.Option(
            "--key-prefix",
            envvar="LATTICE_KEY_PREFIX",
            help="Prefix of every Redis key and queue name; deployments with different prefixes never meet (default: lattice).",
            show_envvar=True,
        ),
    ] = None,
) -> None:
    ctx.obj = Options(broker_url=broker_url, mailbox_url=mailbox_url, key_prefix=key_prefix)


def ensure_cwd_importable() -> None:
    """Make modules of the current directory importable, as on the worker side."""
    # the console script's sys.path[0] is its own directory, and a team
    # reference usually names a module in the current directory
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def client_for(options: Options) -> Any:
    """A :class:`~lattice_client.client.LatticeClient` on the settings of ``options``."""
    from ..client import LatticeClient

    return LatticeClient(settings=options.settings())


__all__ = ["Options", "app", "client_for", "ensure_cwd_importable", "options_of"]
