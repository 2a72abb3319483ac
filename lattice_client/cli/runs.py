"""Run commands of ``lattice``: ``submit``, ``wait``, ``events``, ``cancel``.

They use :class:`~lattice_client.client.LatticeClient` only.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from .app import app, client_for, ensure_cwd_importable, options_of
from .output import check_timeout, err, fail, guard, out, print_result


@app.command()
def submit(
    ctx: typer.Context,
    team: Annotated[
        str,
        typer.Argument(
            help="The team: its registered name (e.g. demo) or a 'package.module:attribute' reference (e.g. lattice_worker.examples.team:team)."
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
            help="Accept a team name no worker has registered yet (workers start later); "
            "a misspelt name then waits in Redis forever.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Submit a run to a team's lead queue; print its run id (and, with --wait, its result).

    TEAM is a name a worker has registered (workers register their teams when
    they start) or a 'package.module:attribute' reference to a Team; anything
    else is refused with nothing queued (--allow-unregistered accepts a name
    before its workers start). A worker for the team must be running
    (lattice worker TEAM_REF) for the run to make progress; the task waits in
    Redis until one is.

    Example: lattice submit lattice_worker.examples.team:team "Look through ./docs for the word lease" --wait --timeout 120
    """
    check_timeout(timeout)
    meta: dict[str, Any] | None = None
    if metadata is not None:
        try:
            meta = json.loads(metadata)
        except ValueError as exc:
            fail(f"--metadata is not valid JSON: {exc}")
        if not isinstance(meta, dict):
            fail("--metadata must be a JSON object")
    options = options_of(ctx)
    code = 0
    with guard():
        client = client_for(options)
        try:
            ensure_cwd_importable()
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
            code = print_result(handle.wait(timeout=timeout), as_json)
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
    check_timeout(timeout)
    code = 0
    with guard():
        client = client_for(options_of(ctx))
        try:
            code = print_result(client.wait(run_id, timeout=timeout), as_json)
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
    check_timeout(timeout)
    with guard():
        client = client_for(options_of(ctx))
        try:
            for event in client.events(run_id, timeout=timeout):
                out.print(json.dumps(event, ensure_ascii=False, default=str), markup=False)
        finally:
            client.close()


@app.command()
def cancel(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run id printed by 'lattice submit'.")],
) -> None:
    """Cancel a run: its remaining mailbox work becomes 'cancelled' (works with no worker online)."""
    with guard():
        client = client_for(options_of(ctx))
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
