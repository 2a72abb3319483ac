"""Help texts of ``lattice`` the way a person types the command.

Typer 0.29 renders every argument as ``{team} <str>`` in the usage line and
every value as ``<bool>`` / ``<float>``. :class:`LatticeCommand` and
:class:`LatticeGroup` (Typer's ``cls=`` extension point) render click's plain
layout instead, from the parameters themselves::

    Usage: lattice submit [OPTIONS] TEAM PROMPT
    ...
    Options:
      -w, --wait              Wait for the final result and print it.
      -t, --timeout SECONDS   With --wait: give up after this many seconds (exit code 3).

A flag shows only its names; an option that takes a value shows its
``metavar`` (or its name in capitals); an argument is its ``metavar`` (or its
name in capitals), in ``[...]`` when optional.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption


def argument_label(param: TyperArgument) -> str:
    """``TEAM``, ``[TEAM]`` when optional, ``TEAM...`` when it takes many values."""
    name = param.metavar or (param.name or "").upper()
    if param.nargs != 1:
        name += "..."
    return name if param.required else f"[{name}]"


def option_label(param: TyperOption) -> str:
    """``-w, --wait`` for a flag, ``-t, --timeout SECONDS`` for an option with a value."""
    names = ", ".join(sorted(param.opts, key=lambda o: (o.startswith("--"), o)))
    if param.secondary_opts:
        names += " / " + ", ".join(param.secondary_opts)
    if param.is_flag or param.count:
        return names
    return f"{names} {param.metavar or (param.name or 'value').upper()}"


def _extras(param: Any) -> str:
    extra = []
    envvar = getattr(param, "envvar", None)
    if envvar and getattr(param, "show_envvar", False):
        extra.append(f"env var: {envvar if isinstance(envvar, str) else ', '.join(envvar)}")
    default = param.default
    is_flag = isinstance(param, TyperOption) and (param.is_flag or param.count)
    if (
        getattr(param, "show_default", False) is not False
        and not is_flag
        and default not in (None, "", (), [])
        and not callable(default)
    ):
        extra.append(f"default: {default}")
    if param.required and isinstance(param, TyperArgument):
        extra.append("required")
    return f"  [{'; '.join(extra)}]" if extra else ""


def format_parameters(command: Any, ctx: typer.Context, formatter: Any) -> None:
    """The ``Arguments:`` and ``Options:`` sections of ``command``'s help."""
    arguments: list[tuple[str, str]] = []
    options: list[tuple[str, str]] = []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        help_text = (getattr(param, "help", None) or "") + _extras(param)
        if isinstance(param, TyperArgument):
            arguments.append((argument_label(param), help_text.strip()))
        elif isinstance(param, TyperOption):
            options.append((option_label(param), help_text.strip()))
    for title, rows in (("Arguments", arguments), ("Options", options)):
        if rows:
            with formatter.section(title):
                formatter.write_dl(rows)


class LatticeCommand(TyperCommand):
    """A Typer command whose usage line and help read as typed (see the module docstring)."""

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        pieces += [argument_label(p) for p in self.get_params(ctx) if isinstance(p, TyperArgument)]
        return pieces

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        format_parameters(self, ctx, formatter)
        self.format_epilog(ctx, formatter)


class HelpGroup(TyperGroup):
    """The top-level group's help: usage, text, the global options, the commands."""

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        format_parameters(self, ctx, formatter)
        self.format_commands(ctx, formatter)
        self.format_epilog(ctx, formatter)


__all__ = [
    "HelpGroup",
    "LatticeCommand",
    "argument_label",
    "format_parameters",
    "option_label",
]
