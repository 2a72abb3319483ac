"""``lattice drain TEAM_REF``: process member mailboxes by hand against the live Redis mailbox.

Each member claims from its *own* mailbox and is prompted; nothing is rerouted
(docs/operate.md, "drain: do a member's work by hand"). Unlike
``Team.drain`` (in-process, embedded mailbox), this drives the distributed
runtime's own member step (:func:`lattice_worker.runtime.member.step.process_claimed`)
in this process: claims carry a lease renewed while the member works, the
outcome completes the work item in the run store, and a run whose last item
completes gets its ``resume_lead`` task (and newly allowed items their
doorbells) exactly as if a worker had done it -- so waiting runs resume on
the workers. A rich progress display shows what is processed.

Each round visits every selected member mailbox once and claims at most one
message from it; draining stops after ``max_rounds`` rounds, after
``max_messages`` messages, or after a round that found nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

from lattice_client.celery_config import make_celery_app
from lattice_client.registry import LiveRegistry, read_workers_blocking
from lattice_client.runstore import RunStore
from lattice_client.settings import get_settings
from lattice_mailbox.connections import sync_redis

from ...errors import ConfigError
from ...team.drain import DrainResult
from ...team.member import TeamMember
from ...team.team import Team
from ..limits.hook import waits_in_place
from ..member.step import claim_startable, member_mode, process_claimed
from ..run.context import WorkerContext, default_worker_id
from .process import make_mailbox
from .registry import TeamRegistry


@dataclass
class _Target:
    team: Team
    member: TeamMember

    @property
    def mailbox_id(self) -> str:
        return self.team.mailbox_id(self.member.name)


def _targets(registry: TeamRegistry, root: Team, members: Sequence[str]) -> list[_Target]:
    teams = [root] + registry.descendants(root.name)
    targets = [_Target(t, m) for t in teams for m in t.members]
    if members:
        known = {t.member.name for t in targets}
        missing = [m for m in members if m not in known]
        if missing:
            raise ConfigError(
                f"unknown member(s) {', '.join(missing)}; members: {', '.join(sorted(known)) or '(none)'}"
            )
        targets = [t for t in targets if t.member.name in members]
    return targets


def _is_tty(console: Console) -> bool:
    # the file itself, not console.is_terminal: FORCE_COLOR / TTY_COMPATIBLE make rich treat a
    # pipe as a terminal, and a redrawn bar there is a stream of \r and cursor codes
    isatty = getattr(console.file, "isatty", None)
    return bool(isatty is not None and isatty())


async def drain_async(
    ctx: WorkerContext, targets: list[_Target], max_rounds: int, max_messages: int, console: Console
) -> DrainResult:
    """Drain ``targets`` (see the module doc); returns ``DrainResult(processed,
    failed, rounds)`` where ``rounds`` counts the rounds that processed a message."""
    processed = failed = rounds = passes = 0
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[last]}"),
        console=console,
        transient=False,
        disable=not _is_tty(console),  # not a terminal: the per-message lines only, no redrawn bar
    ) as progress:
        bar = progress.add_task("draining", total=max_messages, last="")
        while passes < max_rounds and processed < max_messages:
            passes += 1
            found = False
            for target in targets:
                if processed >= max_messages:
                    break
                # as a doorbell would: never an item its run still queues
                message = await claim_startable(ctx, target.mailbox_id, member_mode(target.member))
                if message is None:
                    continue
                found = True
                progress.update(bar, last=f"{target.mailbox_id}: {message.id}")
                with waits_in_place():  # no worker comes back for a step drain ends: its calls wait here
                    status = await process_claimed(ctx, target.team, target.member, message)
                processed += 1
                if status in ("failed", "lost", "cancelled"):
                    failed += 1
                progress.update(bar, advance=1, last=f"{target.mailbox_id}: {message.id} -> {status}")
                console.print(f"  {escape(target.mailbox_id)}  {escape(message.id)}  -> {escape(status)}")
            if not found:
                break
            rounds += 1
        progress.update(bar, total=max(processed, 1) if processed < max_messages else max_messages)
    return DrainResult(processed=processed, failed=failed, rounds=rounds)


def load_root(registry: TeamRegistry, team_ref: str, broker_url: str, prefix: str) -> Team:
    """The team ``lattice drain`` works on: a reference, a name registered in
    this process, or -- failing both -- a name a live worker published in the
    live registry (:mod:`lattice_client.registry`; that worker's reference is
    imported here, see :meth:`TeamRegistry.load_published`). Raises :class:`ConfigError`."""
    try:
        return registry.load(team_ref)
    except ConfigError:
        if not isinstance(team_ref, str) or ":" in team_ref or not team_ref.strip():
            raise
    client = sync_redis(broker_url, decode_responses=True)
    try:
        published = LiveRegistry(read_workers_blocking(client, prefix)).mapping()
    finally:
        client.close()
    return registry.load_published(team_ref, published)


def run_drain(
    team_ref: str,
    members: Sequence[str] | None,
    max_rounds: int,
    max_messages: int,
    console: Console | None = None,
) -> DrainResult:
    """Body of ``lattice drain``.

    Args:
        team_ref: ``"package.module:attribute"`` or a team name (registered in
            this process, or by a running worker in ``<prefix>:teams``).
        members: member names to drain (empty = every member of the team and its nested teams).
        max_rounds: passes over the members (>= 1).
        max_messages: messages to process at most (>= 1).
        console: a rich ``Console`` for the progress display (default stdout).

    Raises :class:`ConfigError` for a bad reference, an unknown member or a
    limit below 1. Returns the :class:`~lattice_worker.team.drain.DrainResult`.
    """
    for label, value in (("max_rounds", max_rounds), ("max_messages", max_messages)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{label} must be a positive integer, got {value!r}")
    console = console or Console()
    settings = get_settings()
    registry = TeamRegistry(make_mailbox(settings))
    root = load_root(registry, team_ref, settings.state_url, settings.key_prefix)
    targets = _targets(registry, root, list(members or []))
    celery = make_celery_app(settings)

    def send(name: str, args: list, queue: str, countdown: float | None = None) -> None:
        celery.send_task(name, args=args, queue=queue, countdown=countdown)

    async def main() -> DrainResult:
        runs = RunStore(settings.state_url, settings.key_prefix, max_events=settings.max_run_events)
        ctx = WorkerContext(
            settings=settings,
            registry=registry,
            mailbox=registry.mailbox,
            runs=runs,
            send_task=send,
            worker_id=f"drain:{default_worker_id()}",
        )
        try:
            return await drain_async(ctx, targets, max_rounds, max_messages, console)
        finally:
            await ctx.aclose()  # what is queued is written first
            aclose = getattr(registry.mailbox, "aclose", None)
            if aclose is not None:
                await aclose()

    try:
        result = asyncio.run(main())
    finally:
        celery.close()
    console.print(
        f"[bold]drained[/bold] {result.processed} message(s), {result.failed} failed, in {result.rounds} round(s)"
    )
    return result


__all__ = ["drain_async", "load_root", "run_drain"]
