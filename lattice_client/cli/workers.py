"""Worker-side commands of ``lattice``: ``worker``, ``drain``, ``demo``.

They import ``lattice_worker`` lazily, when they run. In an install without
the ``worker`` extra (the thin client: ``pip install agent-lattice``) they
stop with one line saying which extra to install.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
from typing import Annotated, Any

import typer

from .app import command, options_of
from .output import fail, guard, out

DISTRIBUTION = "agent-lattice"
WORKER_EXTRA = "worker"
"""The extra that adds what workers need: ``pip install 'agent-lattice[worker]'``."""

_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def missing_worker_packages(extra: str = WORKER_EXTRA) -> list[str]:
    """The distributions ``agent-lattice[extra]`` requires that are not installed
    (``[]`` also when agent-lattice itself is not installed, e.g. run from a checkout)."""
    try:
        requirements = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    missing = []
    for requirement in requirements:
        marker = _EXTRA_MARKER.search(requirement)
        name = _NAME.match(requirement)
        if marker is None or marker.group(1) != extra or name is None:
            continue
        try:
            importlib.metadata.distribution(name.group(0))
        except importlib.metadata.PackageNotFoundError:
            missing.append(name.group(0))
    return missing


def require_extra(command_name: str, extra: str = WORKER_EXTRA) -> None:
    """Stop with one line when ``agent-lattice[extra]`` is not installed."""
    missing = missing_worker_packages(extra)
    if missing:
        fail(
            f"lattice {command_name} needs the {extra} extra: pip install '{DISTRIBUTION}[{extra}]' "
            f"(missing: {', '.join(missing)})"
        )


def worker_function(command_name: str, module: str, name: str) -> Any:
    """``module.name`` of the worker side, imported now; one line when it cannot be."""
    require_extra(command_name)
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        fail(
            f"the worker side is not available ({module}.{name}): {exc}; "
            f"install it with pip install '{DISTRIBUTION}[{WORKER_EXTRA}]'"
        )


PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


@command(context_settings=PASS_THROUGH)
def worker(
    ctx: typer.Context,
    team_ref: Annotated[
        str,
        typer.Argument(
            metavar="TEAM_REF",
            help="The team definition, 'package.module:attribute' (e.g. lattice_worker.examples.team:team).",
        ),
    ],
    member: Annotated[
        list[str] | None,
        typer.Option(
            "--member",
            "-m",
            metavar="NAME",
            help="Consume only this member's queue (repeatable; 'lead' = the lead's queue). Default: every queue of the team.",
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency",
            "-c",
            min=1,
            metavar="N",
            help="Steps (model calls) in flight in the process: default 300 on the default "
            "asyncio pool, 200 on --pool threads; processes with --pool prefork (default: one per CPU).",
        ),
    ] = None,
) -> None:
    """Start a Celery worker for a team's queues.

    The default pool, asyncio, runs every step of the process on one event
    loop (300 at a time): model calls mostly wait on the network, so one
    process keeps many in flight in little memory. It uses one CPU at most:
    past about 150 steps/s add processes, not concurrency. Plain (non-async)
    tool handlers run in threads; for CPU-bound tools use --pool prefork (one
    process per step); --pool threads gives each step a thread of its own.
    Other Celery worker options go after TEAM_REF and pass through, e.g.:
    lattice worker lattice_worker.examples.team:team --member searcher --pool prefork --concurrency 4 --loglevel INFO
    """
    options = options_of(ctx)
    with guard():
        options.settings()  # validate before handing over
    options.export_env()
    run_worker = worker_function("worker", "lattice_worker.runtime.worker.main", "run_worker")
    with guard():
        run_worker(team_ref, list(member or []), concurrency, list(ctx.args))


@command()
def drain(
    ctx: typer.Context,
    team_ref: Annotated[
        str,
        typer.Argument(
            metavar="TEAM_REF",
            help="The team definition, 'package.module:attribute' (e.g. lattice_worker.examples.team:team).",
        ),
    ],
    member: Annotated[
        list[str] | None,
        typer.Option(
            "--member",
            "-m",
            metavar="NAME",
            help="Drain only this member's mailbox (repeatable). Default: every member.",
        ),
    ] = None,
    max_rounds: Annotated[
        int,
        typer.Option(
            "--max-rounds", min=1, metavar="N", help="Stop after this many passes over the members."
        ),
    ] = 10,
    max_messages: Annotated[
        int,
        typer.Option("--max-messages", min=1, metavar="N", help="Stop after processing this many messages."),
    ] = 100,
) -> None:
    """Process member mailboxes by hand, in this process, against the live Redis mailbox.

    Each member claims its own pending messages and replies upstream, as a
    worker would; waiting runs resume when their last item completes.
    """
    options = options_of(ctx)
    with guard():
        options.settings()
    options.export_env()
    run_drain = worker_function("drain", "lattice_worker.runtime.worker.drain", "run_drain")
    with guard():
        run_drain(team_ref, list(member or []), max_rounds, max_messages, out)


@command()
def demo(
    ctx: typer.Context,
    directory: Annotated[
        str, typer.Argument(metavar="DIRECTORY", help="The directory the example team looks through.")
    ] = ".",
    word: Annotated[
        str | None,
        typer.Option(
            "--word", metavar="WORD", help="The word the searcher looks for (default: the demo's own)."
        ),
    ] = None,
) -> None:
    """Run the example team end to end in this process (no Redis, no workers).

    Without an API key a scripted model plays the agents; with ANTHROPIC_API_KEY
    or DEEPSEEK_API_KEY set, a real model does.
    """
    if not os.path.isdir(directory):
        fail(f"not a directory: {directory}")
    options_of(ctx).export_env()
    run_demo = worker_function("demo", "lattice_worker.demo", "run_demo")
    with guard():
        try:
            run_demo(directory, word, out)
        except RuntimeError as exc:  # the run's own error, said once
            fail(str(exc), exc=exc)


__all__ = ["WORKER_EXTRA", "missing_worker_packages", "worker_function"]
