"""What the team's parts (runner, drain, lead tools) use of the team that owns them.

:class:`TeamShape` is the part of :class:`~lattice_worker.team.team.Team` they
read; ``team.py`` builds them and imports them, so they name this protocol,
not the class.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from .member import TeamMember


class TeamShape(Protocol):
    """The team as its runner, its drain and its lead's member tools see it."""

    name: str
    lead: Any
    members: list[TeamMember]
    mailbox: Any
    runner_options: Any
    expose_lead_mailbox_tools: bool

    def member(self, name: str) -> TeamMember: ...

    def mailbox_lock(self, box: str) -> asyncio.Lock: ...


__all__ = ["TeamShape"]
