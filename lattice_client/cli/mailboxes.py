"""Mailbox commands of ``lattice``: ``status`` and ``inbox``.

They use :class:`~lattice_client.client.LatticeClient` only. A team name or
mailbox id this deployment does not know (no worker registered the team or a
team with that member, no message ever went to the mailbox) is refused with the known ones listed and
the closest suggested, so a typo never reads as "nothing here".
"""

from __future__ import annotations

import difflib
import json
from typing import Annotated, Any

import typer

from ..celery_config import queue_name
from ..tables import (
    budget_waits_table,
    inbox_table,
    mailboxes_table,
    rate_limited_table,
    runs_table,
    waits_table,
)
from ..workers_view import workers_table
from .app import client_for, command, options_of
from .output import fail, guard, out

_STATUS_CHOICES = "pending, processing, done, failed, cancelled, read, parked or all"
_LISTED = 20


def known_list(name: str, known: list[str], what: str) -> str:
    """``"<what>: a, b, c (did you mean b?)"`` (at most 20 listed), or ``"no <what> yet"``.
    Mailbox ids (``team::member``) are matched part by part: a shared team
    name alone does not make a member name close."""
    if not known:
        return f"no {what} yet"
    listed = ", ".join(known[:_LISTED]) + (", ..." if len(known) > _LISTED else "")
    close = _closest(name, known)
    return f"{what}: {listed}" + (f" (did you mean {close}?)" if close else "")


def _closest(name: str, known: list[str]) -> str | None:
    team, sep, member = name.partition("::")
    if not sep:
        found = difflib.get_close_matches(name, known, n=1)
        return found[0] if found else None
    teams = {k.partition("::")[0] for k in known}
    if team not in teams:  # the team part is wrong: suggest by it
        found = difflib.get_close_matches(team, sorted(teams), n=1)
        return f"{found[0]}::{member}" if found and f"{found[0]}::{member}" in known else None
    members = [k.partition("::")[2] for k in known if k.partition("::")[0] == team]
    found = difflib.get_close_matches(member, members, n=1)
    return f"{team}::{found[0]}" if found else None


def check_team(client: Any, team: str, prefix: str) -> None:
    """Refuse (``error:`` line, exit 1) a team name that is not registered and has no mailboxes or runs."""
    if client.team_exists(team):
        return
    hint = f" (a reference needs ':attribute', e.g. '{team}:team')" if "." in team and ":" not in team else ""
    fail(
        f"unknown team {team!r}{hint}: no worker registered it and it has no mailboxes or runs under key "
        f"prefix {prefix!r}; {known_list(team, client.known_teams(), 'known teams')}"
    )


def check_mailbox(client: Any, mailbox: str, prefix: str) -> None:
    """Refuse a malformed mailbox id, or one that never received a message and
    is no member of a team a live worker serves."""
    team, sep, member = mailbox.partition("::")
    if not sep or not team or not member:
        fail(f"invalid mailbox id {mailbox!r}: expected '<team>::<member>', e.g. demo::searcher")
    known = client.known_mailboxes()
    if mailbox in known:
        return
    fail(
        f"unknown mailbox {mailbox!r}: no message was ever sent to it under key prefix {prefix!r} "
        "and no live worker serves a team with that member; "
        f"{known_list(mailbox, known, 'known mailboxes')}"
    )


def _team_queues(report: Any, prefix: str) -> list[str]:
    """The queues of ``report.team``: its lead's and one per member mailbox it has."""
    if not report.team:
        return []
    members = {"lead"} | {box.partition("::")[2] for box in report.mailboxes}
    return sorted(queue_name(prefix, report.team, member) for member in members if member)


BUDGET_WAITS_TITLE = "parked at the run's token budget (lattice budget RUN_ID --tokens N)"
"""The title of the table of work parked at a budget (``lattice status``, ``lattice parked``)."""


@command()
def status(
    ctx: typer.Context,
    team: Annotated[
        str | None,
        typer.Argument(
            metavar="TEAM",
            help="Only this team's mailboxes and runs: its name (e.g. demo) or its reference "
            "(lattice_worker.examples.team:team).",
        ),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, metavar="N", help="How many recent runs to list.")
    ] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Show the live workers per queue, mailbox message counts, recent runs and the calls waiting for a person.

    Live workers per queue, counts per mailbox and status (pending, processing,
    done, ..., parked), the most recent runs, then any parked calls and
    pending approvals, the model calls waiting for their turn under the
    shared rate limits (per model and API key id, with the limit that made
    them wait), and the work parked at its run's token budget (the run's lead
    or a member's message, with the tokens spent of the budget).

    Tables fit the terminal width; in a narrow one the least useful columns are
    hidden (a note says which), the widest text column is shortened with '…',
    and --json shows everything. An unknown team name is refused with the
    known ones listed (exit code 1).
    """
    with guard():
        options = options_of(ctx)
        client = client_for(options)
        try:
            if team and ":" not in team:
                check_team(client, team, client.settings.key_prefix)
            report = client.status(team, limit=limit)
        finally:
            client.close()
    if as_json:
        out.print_json(report.model_dump_json())
        return
    expected = _team_queues(report, client.settings.key_prefix)
    if report.workers or expected:
        # a team's queues no live worker consumes show with 0 workers (its lead's, its mailboxes')
        title = f"live workers of {report.team}" if report.team else "live workers"
        out.print(workers_table(title, report.workers, out.width, expected_queues=expected))
    else:
        out.print("no live worker", markup=False)
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
    if report.rate_limited:
        title = "model calls waiting for their turn (LATTICE_MODEL_LIMITS)"
        out.print(rate_limited_table(title, report.rate_limited, out.width))
    if report.budget_waits:
        out.print(budget_waits_table(BUDGET_WAITS_TITLE, report.budget_waits, out.width))


@command()
def inbox(
    ctx: typer.Context,
    mailbox: Annotated[
        str,
        typer.Argument(metavar="MAILBOX", help="The mailbox id, '<team>::<member>' (e.g. demo::searcher)."),
    ],
    status_: Annotated[
        str, typer.Option("--status", "-s", metavar="STATUS", help=f"Which messages: {_STATUS_CHOICES}.")
    ] = "pending",
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """List the messages of one mailbox, oldest first.

    Example (the example team, lattice_worker.examples.team:team, is named demo): lattice inbox demo::searcher --status all

    In a narrow terminal the created and from columns (and, for one status
    other than all, the status column) are hidden first; --json shows everything. A mailbox that never received a
    message is refused with the known ones listed (exit code 1).
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
            check_mailbox(client, mailbox, client.settings.key_prefix)
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
    out.print(inbox_table(f"{mailbox} ({status_})", messages, out.width, status_in_title=status_ != "all"))
