"""Mailbox commands of ``lattice``: ``status`` and ``inbox``.

They use :class:`~lattice_client.client.LatticeClient` only.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ..tables import inbox_table, mailboxes_table, runs_table
from .app import app, client_for, ensure_cwd_importable, options_of
from .output import fail, guard, out

_STATUS_CHOICES = "pending, processing, done, failed, cancelled, read, parked or all"


@app.command()
def status(
    ctx: typer.Context,
    team: Annotated[
        str | None,
        typer.Argument(
            help="Only this team's mailboxes and runs: its name (e.g. demo) or its reference (lattice_worker.examples.team:team)."
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many recent runs to list.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Show message counts per mailbox (pending, processing, done, ...) and the most recent runs.

    Tables fit the terminal width; in a narrow one the least useful columns are
    hidden (a note says which) and --json shows everything.
    """
    with guard():
        options = options_of(ctx)
        client = client_for(options)
        try:
            ensure_cwd_importable()
            report = client.status(team, limit=limit)
        finally:
            client.close()
    if as_json:
        out.print_json(report.model_dump_json())
        return
    if report.mailboxes:
        title = f"mailboxes of {team}" if team else "mailboxes"
        out.print(mailboxes_table(title, report.mailboxes, out.width))
    else:
        out.print("no mailboxes yet" + (f" for team {team!r}" if team else ""), markup=False)
    if report.runs:
        out.print(runs_table("recent runs", report.runs, out.width))
    else:
        out.print("no runs yet", markup=False)


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

    Example (the example team, lattice_worker.examples.team:team, is named demo): lattice inbox demo::searcher --status all

    In a narrow terminal the from, created (and, for one status, status) columns
    are hidden first; --json shows everything.
    """
    from lattice_mailbox import MessageStatus

    if status_ != "all":
        try:
            MessageStatus.parse(status_)
        except ValueError:
            fail(f"unknown status {status_!r}; expected {_STATUS_CHOICES}")
    with guard():
        client = client_for(options_of(ctx))
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
