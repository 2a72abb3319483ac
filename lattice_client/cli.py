"""The ``lattice`` command: submit and follow runs, inspect mailboxes, start workers and Flower.

Design: DESIGN.md section 7; issue 6 item 6. Client commands (``submit``,
``wait``, ``events``, ``status``, ``inbox``, ``cancel``) use
:class:`~lattice_client.client.LatticeClient` only. Worker-side commands
(``worker``, ``drain``, ``demo``) import ``lattice_worker`` lazily, when they run;
``flower`` replaces this process with ``celery -A lattice_worker.runtime.celery_app:app flower``.

Settings come from the global options or ``LATTICE_*`` environment variables.
Bad input or an unreachable Redis prints one ``error: ...`` line on stderr and
exits with a non-zero code (1 = error, 3 = timeout); never a traceback.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console

from .cli_logging import show_client_warnings
from .decisions_cli import register as register_decision_commands
from .decisions_cli import waits_table
from .settings import LatticeSettings, get_settings
from .tables import inbox_table, mailboxes_table, runs_table
from .workers_view import workers_table

EXIT_ERROR = 1
"""Exit code of a failed command (bad input, unknown run, Redis unreachable, failed run)."""

EXIT_TIMEOUT = 3
"""Exit code when ``--timeout`` passed before the run finished."""

FLOWER_APP = "lattice_worker.runtime.celery_app:app"
"""The Celery app Flower monitors (the worker side's app, same settings)."""

_STATUS_CHOICES = "pending, processing, done, failed, cancelled, read, parked or all"

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

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


@dataclass
class _Options:
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


def _options(ctx: typer.Context) -> _Options:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, _Options) else _Options()


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
    ctx.obj = _Options(broker_url=broker_url, mailbox_url=mailbox_url, key_prefix=key_prefix)


# -- error handling --------------------------------------------------------------------------------


def _fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    err.print(f"[red]error:[/red] {' '.join(message.split())}", markup=True, highlight=False)
    raise typer.Exit(code)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        parts = []
        for error in exc.errors():
            loc = ".".join(str(x) for x in error.get("loc", ()))
            msg = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}" if loc else msg)
        return "invalid settings: " + "; ".join(parts)
    text = str(exc) or type(exc).__name__
    return text


@contextlib.contextmanager
def _guard() -> Iterator[None]:
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
        raise typer.Exit(130) from None
    except (RedisConnectionError, RedisTimeoutError, OperationalError) as exc:
        _fail(f"cannot reach Redis: {_describe(exc)}")
    except RedisError as exc:
        _fail(f"Redis error: {_describe(exc)}")
    except TimeoutError as exc:
        _fail(_describe(exc), EXIT_TIMEOUT)
    except (ValueError, LookupError, ImportError, OSError, TypeError) as exc:
        _fail(_describe(exc))
    except Exception as exc:  # never a traceback for a user
        _fail(f"{type(exc).__name__}: {_describe(exc)}")


def _client(options: _Options) -> Any:
    from .client import LatticeClient

    show_client_warnings(err)
    return LatticeClient(settings=options.settings())


# -- formatting ------------------------------------------------------------------------------------


def _print_result(result: Any, as_json: bool) -> int:
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
    return 0 if result.status == "completed" else EXIT_ERROR


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and timeout < 0:
        _fail(f"--timeout must be >= 0 seconds, got {timeout}")


# -- client commands -------------------------------------------------------------------------------


@app.command()
def submit(
    ctx: typer.Context,
    team: Annotated[
        str,
        typer.Argument(
            help="The team: its registered name (e.g. demo) or a 'package.module:attribute' reference (e.g. examples.team:team)."
        ),
    ],
    prompt: Annotated[str, typer.Argument(help="What to ask the team's lead.")],
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Wait for the final result and print it.")
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", "-t", help="With --wait: give up after this many seconds (exit code 3)."),
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option("--run-id", help="Your own run id (1-128 of [A-Za-z0-9_.:-]); default: generated."),
    ] = None,
    metadata: Annotated[
        str | None,
        typer.Option("--metadata", help="A JSON object kept on the run record, e.g. '{\"ticket\": 42}'."),
    ] = None,
    allow_unregistered: Annotated[
        bool,
        typer.Option(
            "--allow-unregistered",
            help="Accept a team name no live worker serves (its workers start later; a warning is printed); "
            "a misspelt name then waits in Redis forever.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Submit a run to a team's lead queue; print its run id (and, with --wait, its result).

    TEAM is the name or the 'package.module:attribute' reference of a team a
    live worker serves (workers publish their teams while they run; nothing is
    imported here); anything else is refused with nothing queued.
    --allow-unregistered accepts a team name no live worker serves (a warning
    is printed): the run waits in Redis until a worker for it starts.

    Example: lattice submit examples.team:team "Look through ./docs for the word lease" --wait --timeout 120
    """
    _check_timeout(timeout)
    meta: dict[str, Any] | None = None
    if metadata is not None:
        try:
            meta = json.loads(metadata)
        except ValueError as exc:
            _fail(f"--metadata is not valid JSON: {exc}")
        if not isinstance(meta, dict):
            _fail("--metadata must be a JSON object")
    options = _options(ctx)
    code = 0
    with _guard():
        client = _client(options)
        try:
            handle = client.submit(
                team, prompt, run_id=run_id, metadata=meta, require_registered=not allow_unregistered
            )
            if not wait:
                if as_json:
                    out.print_json(json.dumps({"run_id": handle.run_id}))
                else:
                    out.print(handle.run_id, markup=False)
                    err.print(f"submitted; follow it with: lattice wait {handle.run_id}", markup=False)
                return
            if not as_json:
                err.print(f"submitted run {handle.run_id}; waiting…", markup=False)
            code = _print_result(handle.wait(timeout=timeout), as_json)
        finally:
            client.close()
    if code:
        raise typer.Exit(code)


@app.command("wait")
def wait_cmd(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run id printed by 'lattice submit'.")],
    timeout: Annotated[
        float | None, typer.Option("--timeout", "-t", help="Give up after this many seconds (exit code 3).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Wait for a run to finish and print its result.

    Exit code 0 when the run completed, 1 when it failed or was cancelled (or
    the run id is unknown), 3 when --timeout passed first.
    """
    _check_timeout(timeout)
    code = 0
    with _guard():
        client = _client(_options(ctx))
        try:
            code = _print_result(client.wait(run_id, timeout=timeout), as_json)
        finally:
            client.close()
    if code:
        raise typer.Exit(code)


@app.command()
def events(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run id printed by 'lattice submit'.")],
    timeout: Annotated[
        float | None, typer.Option("--timeout", "-t", help="Give up after this many seconds (exit code 3).")
    ] = None,
) -> None:
    """Stream a run's events as JSON lines, from the first, until its final result."""
    _check_timeout(timeout)
    with _guard():
        client = _client(_options(ctx))
        try:
            for event in client.events(run_id, timeout=timeout):
                out.print(json.dumps(event, ensure_ascii=False, default=str), markup=False)
        finally:
            client.close()


@app.command()
def status(
    ctx: typer.Context,
    team: Annotated[
        str | None,
        typer.Argument(
            help="Only this team's mailboxes and runs: its name (e.g. demo) or its reference (examples.team:team)."
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many recent runs to list.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Show the live workers per queue, mailbox message counts, recent runs and the tool calls waiting for a person.

    Live workers per queue, counts per mailbox and status (pending, processing,
    done, ..., parked), the most recent runs, then any parked calls and
    pending approvals.

    Tables fit the terminal width; in a narrow one the least useful columns are
    hidden (a note says which) and --json shows everything.
    """
    with _guard():
        options = _options(ctx)
        client = _client(options)
        try:
            report = client.status(team, limit=limit)
        finally:
            client.close()
    if as_json:
        out.print_json(report.model_dump_json())
        return
    if report.workers:
        title = f"live workers of {report.team}" if report.team else "live workers"
        out.print(workers_table(title, report.workers, out.width))
    else:
        out.print("no live worker" + (f" serves team {report.team!r}" if report.team else ""), markup=False)
    if report.mailboxes:
        title = f"mailboxes of {team}" if team else "mailboxes"
        out.print(mailboxes_table(title, report.mailboxes, out.width))
    else:
        out.print("no mailboxes yet" + (f" for team {team!r}" if team else ""), markup=False)
    if report.runs:
        out.print(runs_table("recent runs", report.runs, out.width))
    else:
        out.print("no runs yet", markup=False)
    if report.parked:
        out.print(
            waits_table("parked calls (lattice resolve ID)", report.parked, out.width, id_field="message_id")
        )
    if report.approvals:
        out.print(
            waits_table(
                "pending approvals (lattice approve ID)", report.approvals, out.width, id_field="call_id"
            )
        )


@app.command()
def inbox(
    ctx: typer.Context,
    mailbox: Annotated[str, typer.Argument(help="The mailbox id, '<team>::<member>' (e.g. demo::searcher).")],
    status_: Annotated[
        str, typer.Option("--status", "-s", help=f"Which messages: {_STATUS_CHOICES}.")
    ] = "pending",
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """List the messages of one mailbox, oldest first.

    Example (the example team, examples.team:team, is named demo): lattice inbox demo::searcher --status all

    In a narrow terminal the from, created (and, for one status, status) columns
    are hidden first; --json shows everything.
    """
    from lattice_mailbox import MessageStatus

    if status_ != "all":
        try:
            MessageStatus.parse(status_)
        except ValueError:
            _fail(f"unknown status {status_!r}; expected {_STATUS_CHOICES}")
    with _guard():
        client = _client(_options(ctx))
        try:
            messages = client.inbox(mailbox, status_)
        finally:
            client.close()
    if as_json:
        out.print_json(json.dumps([m.to_json_dict() for m in messages]))
        return
    if not messages:
        out.print(
            f"no {status_} messages in {mailbox}" if status_ != "all" else f"no messages in {mailbox}",
            markup=False,
        )
        return
    out.print(inbox_table(f"{mailbox} ({status_})", messages, out.width))


@app.command()
def cancel(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run id printed by 'lattice submit'.")],
) -> None:
    """Cancel a run: its remaining mailbox work becomes 'cancelled' (works with no worker online)."""
    with _guard():
        client = _client(_options(ctx))
        try:
            report = client.cancel(run_id)
        finally:
            client.close()
    if report.status.value != "cancelled":
        out.print(f"run {run_id} already {report.status.value}; nothing to cancel", markup=False)
        return
    out.print(f"run {run_id} cancelled; {len(report.cancelled_messages)} message(s) cancelled", markup=False)
    for message_id, reason in report.skipped_messages.items():
        out.print(f"  left {message_id}: {reason}", markup=False, style="dim")


# -- worker-side commands (lazy imports) -----------------------------------------------------------


def _worker_function(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        _fail(f"the worker side is not available ({module}.{name}): {exc}")


_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command(context_settings=_PASS_THROUGH)
def worker(
    ctx: typer.Context,
    team_ref: Annotated[
        str, typer.Argument(help="The team definition, 'package.module:attribute' (e.g. examples.team:team).")
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
        typer.Option(
            "--concurrency",
            "-c",
            min=1,
            help="Steps in flight: threads of the default threads pool (default 200), "
            "or processes with --pool prefork (default: one per CPU).",
        ),
    ] = None,
) -> None:
    """Start a Celery worker for a team's queues.

    The default pool is Celery's threads pool with 200 threads: model calls
    mostly wait on the network, so one process keeps many in flight. For
    CPU-bound tools use --pool prefork (one process per step). Other Celery
    worker options go after TEAM_REF and pass through, e.g.:
    lattice worker examples.team:team --member searcher --pool prefork --concurrency 4 --loglevel INFO
    """
    options = _options(ctx)
    with _guard():
        options.settings()  # validate before handing over
    options.export_env()
    run_worker = _worker_function("lattice_worker.runtime.worker_main", "run_worker")
    with _guard():
        run_worker(team_ref, list(member or []), concurrency, list(ctx.args))


@app.command()
def drain(
    ctx: typer.Context,
    team_ref: Annotated[
        str, typer.Argument(help="The team definition, 'package.module:attribute' (e.g. examples.team:team).")
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
    options = _options(ctx)
    with _guard():
        options.settings()
    options.export_env()
    run_drain = _worker_function("lattice_worker.runtime.drain", "run_drain")
    with _guard():
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
        _fail(f"not a directory: {directory}")
    _options(ctx).export_env()
    run_demo = _worker_function("lattice_worker.demo", "run_demo")
    with _guard():
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
    options = _options(ctx)
    with _guard():
        options.settings()
    if importlib.util.find_spec("flower") is None:
        _fail("Flower is not installed (pip install flower)")
    module = celery_app.partition(":")[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        _fail(f"cannot find the Celery app module {module!r} (for {celery_app})")
    options.export_env()
    argv = flower_argv(address, port, list(ctx.args), celery_app=celery_app)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


register_decision_commands(app, client=_client, options=_options, guard=_guard, fail=_fail, out=out)


def main() -> None:  # pragma: no cover - console entry point alternative
    app()


__all__ = ["EXIT_ERROR", "EXIT_TIMEOUT", "FLOWER_APP", "app", "flower_argv", "main"]
