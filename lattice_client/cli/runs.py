"""Run commands of ``lattice``: ``submit``, ``wait``, ``events``, ``cancel``.

They use :class:`~lattice_client.client.LatticeClient` only. A prompt can come
from the command line, from stdin (``-``) or from a file (``@path``), up to
the message bound (``LATTICE_MAX_MESSAGE_BYTES``). Ctrl-C while waiting leaves
the run going and says how to wait for it again or cancel it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from typing import Annotated, Any, BinaryIO

import typer

from .app import Options, client_for, command, options_of
from .output import EXIT_INTERRUPTED, check_timeout, err, fail, guard, out, print_result

BOUND_VARIABLE = "LATTICE_MAX_MESSAGE_BYTES"


def _read_bounded(stream: BinaryIO, what: str, bound: int) -> str:
    data = stream.read(bound + 1)
    if len(data) > bound:
        fail(f"the prompt {what} is over the message bound of {bound} bytes ({BOUND_VARIABLE})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(f"the prompt {what} is not UTF-8 text: {exc}")


def read_prompt(prompt: str, bound: int) -> str:
    """The prompt text: ``-`` reads stdin, ``@path`` reads a file, ``@@text``
    is the literal ``@text``; anything else is the prompt itself. Reads at most
    ``bound`` bytes (the message bound); more is refused with an ``error:`` line."""
    if prompt == "-":
        stdin = sys.stdin
        if stdin is None:
            fail("the prompt is '-' but there is no standard input")
        return _read_bounded(getattr(stdin, "buffer", stdin), "read from stdin", bound)
    if prompt.startswith("@@"):
        return prompt[1:]
    if prompt.startswith("@"):
        path = prompt[1:]
        try:
            with open(path, "rb") as handle:
                return _read_bounded(handle, f"in {path}", bound)
        except OSError as exc:
            fail(
                f"cannot read the prompt file {path!r}: {exc.strerror or exc} "
                "(a prompt that starts with @ is written @@...)"
            )
    return prompt


def follow_up_commands(options: Options, run_id: str) -> str:
    """``lattice [global options] wait RUN_ID`` and ``... cancel RUN_ID``, as one hint."""
    base = " ".join(["lattice", *options.argv()])
    return f"wait for it with: {base} wait {run_id}   cancel it with: {base} cancel {run_id}"


@contextlib.contextmanager
def interruptible(options: Options, run_id: str) -> Iterator[None]:
    """Ctrl-C inside: say the run goes on and how to follow or cancel it; exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        err.print(f"interrupted: run {run_id} continues on the workers.", markup=False)
        err.print(follow_up_commands(options, run_id), markup=False)
        raise typer.Exit(EXIT_INTERRUPTED) from None


HINT_POLL_SECONDS = 5.0
"""How often (seconds) ``wait`` / ``submit --wait`` look at a run that has not
finished, to say once when it parked at its budget (it waits for a person then)."""


def wait_telling(client: Any, options: Options, run_id: str, timeout: float | None) -> Any:
    """``client.wait(run_id, timeout)``, saying once on stderr when the run sits at
    ``budget_reached`` (``wait`` does not return then) and how to move it on.
    Raises ``TimeoutError`` as ``client.wait`` does."""
    deadline = None if timeout is None else time.monotonic() + timeout
    told = False
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        chunk = HINT_POLL_SECONDS if left is None else min(HINT_POLL_SECONDS, left)
        try:  # (a finished or unknown run answers at once, whatever the timeout)
            return client.wait(run_id, timeout=chunk)
        except TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id!r} did not finish within {timeout} s") from None
        record = client.get_run(run_id)
        if record is None or record.status.value != "budget_reached":
            told = False  # raised meanwhile: say it again if it parks again
            continue
        if not told:
            told = True
            base = " ".join(["lattice", *options.argv()])
            err.print(
                f"run {run_id} is parked at its budget ({record.spent_tokens} of {record.budget_tokens} "
                f"tokens spent) and waits until it is raised: {base} budget {run_id} --tokens N",
                markup=False,
            )


@command()
def submit(
    ctx: typer.Context,
    team: Annotated[
        str,
        typer.Argument(
            metavar="TEAM",
            help="The team: its registered name (e.g. demo) or a 'package.module:attribute' reference "
            "(e.g. lattice_worker.examples.team:team).",
        ),
    ],
    prompt: Annotated[
        str,
        typer.Argument(
            metavar="PROMPT",
            help="What to ask the team's lead; '-' reads it from stdin, '@FILE' from a file "
            f"(up to {BOUND_VARIABLE} bytes; '@@...' is a prompt that starts with @).",
        ),
    ],
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Wait for the final result and print it.")
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            "-t",
            metavar="SECONDS",
            help="With --wait: give up after this many seconds (exit code 3).",
        ),
    ] = None,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id",
            metavar="RUN_ID",
            help="Your own run id (1-128 of [A-Za-z0-9_.:-]); default: generated.",
        ),
    ] = None,
    metadata: Annotated[
        str | None,
        typer.Option(
            "--metadata",
            metavar="JSON",
            help="A JSON object kept on the run record, e.g. '{\"ticket\": 42}'.",
        ),
    ] = None,
    allow_unregistered: Annotated[
        bool,
        typer.Option(
            "--allow-unregistered",
            help="Accept a team name no live worker serves (its workers start later; a warning is printed); "
            "a misspelt name then waits in Redis forever.",
        ),
    ] = False,
    budget_tokens: Annotated[
        int | None,
        typer.Option(
            "--budget-tokens",
            metavar="N",
            help="The run's token budget (input, prompt-cache and output tokens of all its model calls); "
            "it parks as budget_reached when spent (raise it with 'lattice budget').",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Submit a run to a team's lead queue; print its run id (and, with --wait, its result).

    TEAM is the name or the 'package.module:attribute' reference of a team a
    live worker serves (workers publish their teams while they run; nothing is
    imported here); anything else is refused with nothing queued.
    --allow-unregistered accepts a team name no live worker serves (a warning
    is printed): the run waits in Redis until a worker for it starts. Ctrl-C
    while waiting leaves the run going.

    Examples: lattice submit lattice_worker.examples.team:team "Look through ./docs for the word lease" --wait --timeout 120;
    lattice submit demo - < prompt.txt; lattice submit demo @prompt.txt --wait
    """
    if timeout is not None and not wait:
        fail("--timeout applies to --wait: add --wait, or leave --timeout out (submit returns at once)")
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
    with guard():
        settings = options.settings()
    text = read_prompt(prompt, settings.max_message_bytes)
    code = 0
    with guard():
        client = client_for(options)
        try:
            handle = client.submit(
                team,
                text,
                run_id=run_id,
                metadata=meta,
                require_registered=not allow_unregistered,
                budget={"tokens": budget_tokens} if budget_tokens is not None else None,
            )
            if not wait:
                if as_json:
                    out.print_json(json.dumps({"run_id": handle.run_id}))
                else:
                    out.print(handle.run_id, markup=False)
                    err.print(f"submitted; follow it with: lattice wait {handle.run_id}", markup=False)
                return
            if not as_json:
                err.print(
                    f"submitted run {handle.run_id}; waiting… (Ctrl-C stops waiting, not the run)",
                    markup=False,
                )
            with interruptible(options, handle.run_id):
                code = print_result(wait_telling(client, options, handle.run_id, timeout), as_json)
        finally:
            client.close()
    if code:
        raise typer.Exit(code)


_RUN_ID = typer.Argument(metavar="RUN_ID", help="The run id printed by 'lattice submit'.")


@command("wait")
def wait_cmd(
    ctx: typer.Context,
    run_id: Annotated[str, _RUN_ID],
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout", "-t", metavar="SECONDS", help="Give up after this many seconds (exit code 3)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Wait for a run to finish and print its result.

    Exit code 0 when the run completed, 1 when it failed or was cancelled (or
    the run id is unknown), 3 when --timeout passed first, 130 after Ctrl-C
    (the run goes on).
    """
    check_timeout(timeout)
    options = options_of(ctx)
    code = 0
    with guard():
        client = client_for(options)
        try:
            with interruptible(options, run_id):
                code = print_result(wait_telling(client, options, run_id, timeout), as_json)
        finally:
            client.close()
    if code:
        raise typer.Exit(code)


@command()
def events(
    ctx: typer.Context,
    run_id: Annotated[str, _RUN_ID],
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout", "-t", metavar="SECONDS", help="Give up after this many seconds (exit code 3)."
        ),
    ] = None,
) -> None:
    """Stream a run's events as JSON lines, from the first, until its final result."""
    check_timeout(timeout)
    options = options_of(ctx)
    with guard():
        client = client_for(options)
        try:
            with interruptible(options, run_id):
                for event in client.events(run_id, timeout=timeout):
                    out.print(json.dumps(event, ensure_ascii=False, default=str), markup=False)
                    if event.get("type") == "run_status" and event.get("status") == "budget_reached":
                        # the stream then stops until the budget is raised: say why, once per park
                        base = " ".join(["lattice", *options.argv()])
                        err.print(
                            f"run {run_id} parked at its budget ({event.get('spent_tokens')} of "
                            f"{(event.get('budget') or {}).get('tokens')} tokens spent); its events go on "
                            f"once it is raised: {base} budget {run_id} --tokens N",
                            markup=False,
                        )
        finally:
            client.close()


@command()
def cancel(
    ctx: typer.Context,
    run_id: Annotated[str, _RUN_ID],
) -> None:
    """Cancel a run: its remaining mailbox work becomes 'cancelled' (works with no worker online).

    Cancelling a run that is already cancelled, completed or failed says so and changes nothing.
    """
    with guard():
        client = client_for(options_of(ctx))
        try:
            report = client.cancel(run_id)
        finally:
            client.close()
    cleaned = len(report.cancelled_messages)
    if report.previous_status is not None and report.previous_status.value == "cancelled":
        extra = f"; {cleaned} leftover message(s) cancelled now" if cleaned else ""
        out.print(f"run {run_id} already cancelled; nothing to cancel{extra}", markup=False)
        return
    if report.status.value != "cancelled":
        out.print(f"run {run_id} already {report.status.value}; nothing to cancel", markup=False)
        return
    out.print(f"run {run_id} cancelled; {cleaned} message(s) cancelled", markup=False)
    for message_id, reason in report.skipped_messages.items():
        out.print(f"  left {message_id}: {reason}", markup=False, style="dim")


@command()
def budget(
    ctx: typer.Context,
    run_id: Annotated[str, _RUN_ID],
    tokens: Annotated[
        int,
        typer.Option(
            "--tokens",
            metavar="N",
            help="The run's new total token budget (not an increment); above what it spent.",
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Raise a run's token budget to N tokens and resume it where it parked (status budget_reached).

    N is the new total, not an increment. Refused, with nothing changed: a
    run that is finished, has no budget, has not reached it, an N not
    above its spend, or another N than a raise still resuming its members.
    """
    with guard():
        client = client_for(options_of(ctx))
        try:
            raised = client.raise_budget(run_id, tokens=tokens)
        finally:
            client.close()
    if as_json:
        out.print_json(raised.model_dump_json())
        return
    moved = ["the lead"] if raised.resumed_lead else []
    moved += [f"message {m}" for m in raised.resumed_messages]
    out.print(
        f"run {run_id}: budget {raised.previous_tokens} -> {raised.budget_tokens} tokens "
        f"({raised.spent_tokens} spent); resumed: {', '.join(moved) or 'nothing was parked'}",
        markup=False,
    )
