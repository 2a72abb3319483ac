"""Worker-side commands of ``lattice``: ``worker``, ``drain``, ``demo``, ``flower``.

``worker``, ``drain`` and ``demo`` import ``lattice_worker`` lazily, when they
run; ``flower`` replaces this process with ``celery -A lattice_worker.celery_app:app flower``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Annotated, Any

import typer

from .app import app, options_of
from .output import fail, guard, out

FLOWER_APP = "lattice_worker.celery_app:app"
"""The Celery app Flower monitors (the worker side's app, same settings)."""


def _worker_function(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        fail(f"the worker side is not available ({module}.{name}): {exc}")


_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command(context_settings=_PASS_THROUGH)
def worker(
    ctx: typer.Context,
    team_ref: Annotated[
        str,
        typer.Argument(
            help="The team definition, 'package.module:attribute' (e.g. lattice_worker.examples.team:team)."
        ),
    ],
    member: Annotated[
        list[str] | None,
        typer.Option(
            "--member",
            "-m",
            help="Consume only this member's queue (repeatable; 'lead' = the lead's queue). Default: every queue of the team.",
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", "-c", min=1, help="Worker processes (Celery --concurrency)."),
    ] = None,
) -> None:
    """Start a Celery worker for a team's queues.

    Other Celery worker options go after TEAM_REF and pass through, e.g.:
    lattice worker lattice_worker.examples.team:team --member searcher --concurrency 4 --loglevel INFO
    """
    options = options_of(ctx)
    with guard():
        options.settings()  # validate before handing over
    options.export_env()
    run_worker = _worker_function("lattice_worker.worker_main", "run_worker")
    with guard():
        run_worker(team_ref, list(member or []), concurrency, list(ctx.args))


@app.command()
def drain(
    ctx: typer.Context,
    team_ref: Annotated[
        str,
        typer.Argument(
            help="The team definition, 'package.module:attribute' (e.g. lattice_worker.examples.team:team)."
        ),
    ],
    member: Annotated[
        list[str] | None,
        typer.Option(
            "--member", "-m", help="Drain only this member's mailbox (repeatable). Default: every member."
        ),
    ] = None,
    max_rounds: Annotated[
        int, typer.Option("--max-rounds", min=1, help="Stop after this many passes over the members.")
    ] = 10,
    max_messages: Annotated[
        int, typer.Option("--max-messages", min=1, help="Stop after processing this many messages.")
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
    run_drain = _worker_function("lattice_worker.drain_cli", "run_drain")
    with guard():
        run_drain(team_ref, list(member or []), max_rounds, max_messages, out)


@app.command()
def demo(
    ctx: typer.Context,
    directory: Annotated[str, typer.Argument(help="The directory the example team looks through.")] = ".",
    word: Annotated[
        str | None, typer.Option("--word", help="The word the searcher looks for (default: the demo's own).")
    ] = None,
) -> None:
    """Run the example team end to end in this process (no Redis, no workers).

    Without an API key a scripted model plays the agents; with ANTHROPIC_API_KEY
    or DEEPSEEK_API_KEY set, a real model does.
    """
    if not os.path.isdir(directory):
        fail(f"not a directory: {directory}")
    options_of(ctx).export_env()
    run_demo = _worker_function("lattice_worker.demo", "run_demo")
    with guard():
        run_demo(directory, word, out)


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


@app.command(context_settings=_PASS_THROUGH)
def flower(
    ctx: typer.Context,
    address: Annotated[str, typer.Option("--address", help="Interface Flower listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="HTTP port of Flower.")] = 5555,
    celery_app: Annotated[
        str, typer.Option("--app", help="The Celery app to monitor, 'module:attribute'.")
    ] = FLOWER_APP,
) -> None:
    """Run Flower (the Celery web monitor) on the workers' app.

    Flower's own options pass through (e.g. --basic-auth=user:pass, --url-prefix=flower),
    and so do FLOWER_* environment variables such as FLOWER_BASIC_AUTH.
    Open http://ADDRESS:PORT in a browser; its HTTP API answers /api/workers and /api/tasks.
    """
    options = options_of(ctx)
    with guard():
        options.settings()
    if importlib.util.find_spec("flower") is None:
        fail("Flower is not installed (pip install flower)")
    module = celery_app.partition(":")[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        fail(f"cannot find the Celery app module {module!r} (for {celery_app})")
    options.export_env()
    argv = flower_argv(address, port, list(ctx.args), celery_app=celery_app)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


__all__ = ["FLOWER_APP", "flower_argv"]
