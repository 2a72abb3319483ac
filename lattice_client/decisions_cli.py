"""The ``lattice`` commands for tool calls that wait for a person
(``docs/tool-effects.md``): ``parked``, ``resolve``, ``approvals``, ``approve``, ``deny``.

:func:`register` adds them to the ``lattice`` app with the app's own helpers
(the client factory, the error guard, the output console), so they behave
like every other client command: one ``error: ...`` line and exit code 1 on
bad input (nothing changed), never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import typer

from .tables import Column, build_table, preview, short_time


def waits_table(title: str, rows: list[Any], width: int, *, id_field: str) -> Any:
    """Parked calls or pending approvals: id, team, member, tool, effect, since, input, reason."""
    columns = [
        Column("id", [str(getattr(r, id_field)) for r in rows], fold=True),
        Column("team", [r.team for r in rows], fold=True),
        Column("member", [r.member for r in rows], fold=True),
        Column("tool", [r.tool_name for r in rows], fold=True),
        Column("effect", [r.effect for r in rows], drop=3),
        Column("since", [short_time(r.created_at) for r in rows], drop=2),
        Column("input", [preview(json.dumps(r.input, default=str), 80) for r in rows], flexible=True, drop=1),
        Column("reason", [preview(r.reason) for r in rows], flexible=True),
    ]
    return build_table(title, columns, width)


def register(
    app: typer.Typer,
    *,
    client: Callable[[Any], Any],
    options: Callable[[typer.Context], Any],
    guard: Callable[[], Any],
    fail: Callable[[str], Any],
    out: Any,
) -> None:
    """Add the decision commands to ``app``. ``client(options(ctx))`` builds a
    ``LatticeClient``; ``guard()`` is the app's error guard; ``fail(message)``
    exits with an error; ``out`` the console."""

    def call(ctx: typer.Context, method: str, *args: Any, **kwargs: Any) -> Any:
        # the guard turns a DecisionError (a ValueError: nothing changed) into one error line
        with guard():
            lattice = client(options(ctx))
            try:
                return getattr(lattice, method)(*args, **kwargs)
            finally:
                lattice.close()

    def listing(
        ctx: typer.Context, method: str, team: str | None, as_json: bool, what: str, id_field: str
    ) -> None:
        rows = call(ctx, method, team)
        if as_json:
            out.print_json(json.dumps([r.model_dump(mode="json") for r in rows]))
        elif not rows:
            out.print(f"no {what}" + (f" for team {team!r}" if team else ""), markup=False)
        else:
            out.print(waits_table(what, rows, out.width, id_field=id_field))

    @app.command()
    def parked(
        ctx: typer.Context,
        team: Annotated[str | None, typer.Argument(help="Only this team's parked calls.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
    ) -> None:
        """List the tool calls parked for a person, oldest first.

        A call is parked when a crash interrupted it and its tool's effect does not
        make it safe to run again. Decide each with 'lattice resolve ID'.
        """
        listing(ctx, "parked", team, as_json, "parked calls", "message_id")

    @app.command()
    def resolve(
        ctx: typer.Context,
        message_id: Annotated[
            str,
            typer.Argument(
                help="The parked call's id (from 'lattice parked'): a message id, or RUN_ID/TOOL_USE_ID."
            ),
        ],
        result: Annotated[
            str | None, typer.Option("--result", help="The call happened: use this text as its result.")
        ] = None,
        retry: Annotated[bool, typer.Option("--retry", help="Run the call again.")] = False,
        fail_reason: Annotated[
            str | None,
            typer.Option("--fail", help="The call failed: the model gets an error result with this reason."),
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
        decided = call(ctx, "resolve", message_id, result=result, retry=retry, fail=fail_reason)
        out.print(
            f"resolved {decided.message_id} ({decided.tool_name}): {given[0].lstrip('-')}; its work goes on",
            markup=False,
        )

    @app.command()
    def approvals(
        ctx: typer.Context,
        team: Annotated[str | None, typer.Argument(help="Only this team's pending approvals.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
    ) -> None:
        """List the tool calls waiting for an approval (permission_mode="by_effect"), oldest first."""
        listing(ctx, "approvals", team, as_json, "pending approvals", "call_id")

    @app.command()
    def approve(
        ctx: typer.Context,
        call_id: Annotated[str, typer.Argument(help="The call's id (from 'lattice approvals').")],
    ) -> None:
        """Approve a waiting tool call: it runs when its work resumes."""
        decided = call(ctx, "approve", call_id)
        out.print(f"approved {decided.call_id} ({decided.tool_name}); its work goes on", markup=False)

    @app.command()
    def deny(
        ctx: typer.Context,
        call_id: Annotated[str, typer.Argument(help="The call's id (from 'lattice approvals').")],
        reason: Annotated[
            str, typer.Option("--reason", help="Why: the model gets it as the call's error result.")
        ],
    ) -> None:
        """Deny a waiting tool call: the model gets an error result with the reason."""
        decided = call(ctx, "deny", call_id, reason)
        out.print(f"denied {decided.call_id} ({decided.tool_name}); its work goes on", markup=False)


__all__ = ["register", "waits_table"]
