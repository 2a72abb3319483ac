"""Commands of ``lattice`` for tool calls that wait for a person
(``docs/tool-effects.md``): ``parked``, ``resolve``, ``approvals``, ``approve``, ``deny``.

They use :class:`~lattice_client.client.LatticeClient` only, and behave like
every other client command: one ``error: ...`` line and exit code 1 on bad
input (a ``DecisionError``: nothing changed; an unknown team name, with the
known ones listed), never a traceback.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ..tables import budget_waits_table, waits_table
from .app import client_for, command, options_of
from .mailboxes import BUDGET_WAITS_TITLE, check_team
from .output import fail, guard, out


def _call(ctx: typer.Context, method: str, *args: Any, **kwargs: Any) -> Any:
    # the guard turns a DecisionError (a ValueError: nothing changed) into one error line
    with guard():
        lattice = client_for(options_of(ctx))
        try:
            return getattr(lattice, method)(*args, **kwargs)
        finally:
            lattice.close()


def _listing(
    ctx: typer.Context, method: str, team: str | None, as_json: bool, what: str, id_field: str
) -> None:
    # an unknown team name is refused with the known ones (a typo never reads as "none")
    with guard():
        lattice = client_for(options_of(ctx))
        try:
            if team and ":" not in team:  # a reference: the client resolves it (or says no worker serves it)
                check_team(lattice, team, lattice.settings.key_prefix)
            rows = getattr(lattice, method)(team)
        finally:
            lattice.close()
    if as_json:
        out.print_json(json.dumps([r.model_dump(mode="json") for r in rows]))
    elif not rows:
        out.print(f"no {what}" + (f" for team {team!r}" if team else ""), markup=False)
    else:
        out.print(waits_table(what, rows, out.width, id_field=id_field))


@command()
def parked(
    ctx: typer.Context,
    team: Annotated[
        str | None,
        typer.Argument(
            metavar="TEAM",
            help="Only this team's parked work: its name or its reference (package.module:attribute).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """List the tool calls parked for a person, then the work parked at its run's token budget, oldest first.

    A call is parked when a crash interrupted it and its tool's effect does not
    make it safe to run again: decide each with 'lattice resolve ID'. A run's
    lead or member message parked at its token budget goes on once the budget
    is raised: 'lattice budget RUN_ID --tokens N'. With --json: one list, each
    entry's "kind" is "tool" or "budget".
    """
    with guard():
        lattice = client_for(options_of(ctx))
        try:
            if team and ":" not in team:  # a reference: the client resolves it (or says no worker serves it)
                check_team(lattice, team, lattice.settings.key_prefix)
            calls, budget = lattice.parked(team), lattice.budget_waits(team)
        finally:
            lattice.close()
    if as_json:
        out.print_json(json.dumps([r.model_dump(mode="json") for r in [*calls, *budget]]))
        return
    if not calls and not budget:
        out.print(
            "no parked calls and no work parked at a budget" + (f" for team {team!r}" if team else ""),
            markup=False,
        )
    if calls:
        out.print(waits_table("parked calls", calls, out.width, id_field="message_id"))
    if budget:
        out.print(budget_waits_table(BUDGET_WAITS_TITLE, budget, out.width))


@command()
def resolve(
    ctx: typer.Context,
    message_id: Annotated[
        str,
        typer.Argument(
            help="The parked call's id (from 'lattice parked'): a message id, or RUN_ID/TOOL_USE_ID."
        ),
    ],
    result: Annotated[
        str | None,
        typer.Option("--result", metavar="TEXT", help="The call happened: use this text as its result."),
    ] = None,
    retry: Annotated[bool, typer.Option("--retry", help="Run the call again.")] = False,
    fail_reason: Annotated[
        str | None,
        typer.Option(
            "--fail",
            metavar="REASON",
            help="The call failed: the model gets an error result with this reason.",
        ),
    ] = None,
) -> None:
    """Decide a parked call and send its work on: exactly one of --result TEXT, --retry, --fail REASON."""
    given = [
        name
        for name, on in (
            ("--result", result is not None),
            ("--retry", retry),
            ("--fail", fail_reason is not None),
        )
        if on
    ]
    if len(given) != 1:
        fail(
            "resolve needs exactly one of --result TEXT, --retry or --fail REASON"
            + (f" (got {' and '.join(given)})" if given else "")
        )
    decided = _call(ctx, "resolve", message_id, result=result, retry=retry, fail=fail_reason)
    out.print(
        f"resolved {decided.message_id} ({decided.tool_name}): {given[0].lstrip('-')}; its work goes on",
        markup=False,
    )


@command()
def approvals(
    ctx: typer.Context,
    team: Annotated[
        str | None,
        typer.Argument(
            metavar="TEAM",
            help="Only this team's pending approvals: its name or its reference (package.module:attribute).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """List the tool calls waiting for an approval (permission_mode="by_effect"), oldest first."""
    _listing(ctx, "approvals", team, as_json, "pending approvals", "call_id")


@command()
def approve(
    ctx: typer.Context,
    call_id: Annotated[
        str, typer.Argument(metavar="CALL_ID", help="The call's id (from 'lattice approvals').")
    ],
) -> None:
    """Approve a waiting tool call: it runs when its work resumes."""
    decided = _call(ctx, "approve", call_id)
    out.print(f"approved {decided.call_id} ({decided.tool_name}); its work goes on", markup=False)


@command()
def deny(
    ctx: typer.Context,
    call_id: Annotated[
        str, typer.Argument(metavar="CALL_ID", help="The call's id (from 'lattice approvals').")
    ],
    reason: Annotated[
        str,
        typer.Option("--reason", metavar="TEXT", help="Why: the model gets it as the call's error result."),
    ],
) -> None:
    """Deny a waiting tool call: the model gets an error result with the reason."""
    decided = _call(ctx, "deny", call_id, reason)
    out.print(f"denied {decided.call_id} ({decided.tool_name}); its work goes on", markup=False)
