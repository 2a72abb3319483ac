"""Drain from the operations page: a member's pending messages processed in
the page's own process, as ``lattice drain TEAM_REF --member NAME`` does.

Draining runs the member's agent, so the page needs the team's definition
(its module, imported here) and the ``worker`` extra. The page offers it only
for the teams it was started with (``lattice ui --drain TEAM_REF``, several
allowed); other mailboxes say how to get it. ``lattice_worker`` is imported
only by :func:`load_targets` and :meth:`DrainTargets.run`, never when the
page starts without ``--drain``.
"""

from __future__ import annotations

import asyncio
import io
import threading
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_MESSAGES = 10
"""Messages one drain from the page processes at most, unless the form says otherwise."""

MAX_ROUNDS = 10
"""Passes over the member's mailbox of one drain (as ``lattice drain --max-rounds``)."""


@dataclass
class DrainTeam:
    """A team the page may drain: the reference it was given and, per team
    name (its own and its nested teams'), the member names."""

    ref: str
    members: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class DrainTargets:
    """The teams given with ``--drain`` (empty: the page drains nothing)."""

    teams: list[DrainTeam] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def for_mailbox(self, mailbox_id: str) -> tuple[str, str] | None:
        """``(team reference, member name)`` to drain ``mailbox_id`` with, or ``None``."""
        team, _, member = mailbox_id.partition("::")
        for entry in self.teams:
            if member in entry.members.get(team, set()):
                return entry.ref, member
        return None

    def why_not(self, mailbox_id: str) -> str:
        """Why ``mailbox_id`` cannot be drained from here (``""`` when it can)."""
        if self.for_mailbox(mailbox_id) is not None:
            return ""
        team, _, member = mailbox_id.partition("::")
        if member == "lead":
            return "a lead's mailbox holds its members' replies: a lead worker reads it"
        if not self.teams:
            return (
                "drain runs the member's agent in this page's process: start the page with "
                f"lattice ui --drain TEAM_REF with the reference of team {team!r} (needs the worker extra)"
            )
        return f"this page was not started with --drain for the team {team!r}"

    def run(self, ref: str, member: str, max_messages: int) -> tuple[Any, str]:
        """Drain ``member`` of the team ``ref`` now, in a thread of its own (one
        drain at a time); returns ``(DrainResult, its output)``. Blocks: call it
        with ``asyncio.to_thread``. Raises ``RuntimeError`` while another drain runs."""
        from rich.console import Console

        from lattice_worker.runtime.worker.drain import run_drain

        if not self.lock.acquire(blocking=False):
            raise RuntimeError("another drain is running on this page; try again when it ends")
        try:
            out = io.StringIO()
            console = Console(file=out, width=200, no_color=True, highlight=False)
            result = run_drain(ref, [member], MAX_ROUNDS, max_messages, console)
            return result, out.getvalue()
        finally:
            self.lock.release()

    async def arun(self, ref: str, member: str, max_messages: int) -> tuple[Any, str]:
        """:meth:`run` from the event loop."""
        return await asyncio.to_thread(self.run, ref, member, max_messages)


def load_targets(refs: list[str]) -> DrainTargets:
    """Import each team reference (``package.module:attribute``) and list its
    members (nested teams too). Raises ``ImportError`` when the worker side is
    not installed and ``ValueError`` (``ConfigError``) for a bad reference."""
    if not refs:
        return DrainTargets()
    from lattice_worker.runtime.worker.process import make_mailbox
    from lattice_worker.runtime.worker.registry import TeamRegistry

    from ..settings import get_settings

    registry = TeamRegistry(make_mailbox(get_settings()))
    teams = []
    for ref in refs:
        root = registry.load(ref)
        members = {t.name: {m.name for m in t.members} for t in [root, *registry.descendants(root.name)]}
        teams.append(DrainTeam(ref, members))
    return DrainTargets(teams)


__all__ = ["DEFAULT_MAX_MESSAGES", "DrainTargets", "DrainTeam", "MAX_ROUNDS", "load_targets"]
