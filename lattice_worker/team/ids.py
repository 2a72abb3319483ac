"""Mailbox and work-item identifiers of a team.

Design: docs/architecture.md,
"Core model" ("Mailbox ids are ``<team>::<member>``; the lead's is
``<team>::lead``"). Used identically by the in-process runner and the
distributed runtime, so the format must not change.
"""

from __future__ import annotations

import uuid

SEPARATOR = "::"
LEAD = "lead"


def mailbox_id(team_name: str, member_name: str) -> str:
    """The mailbox id of ``member_name`` in ``team_name``: ``"<team>::<member>"``."""
    return f"{team_name}{SEPARATOR}{member_name}"


def lead_mailbox_id(team_name: str) -> str:
    """The lead's mailbox id: ``"<team>::lead"`` (where member reports arrive)."""
    return mailbox_id(team_name, LEAD)


def split_mailbox_id(value: str) -> tuple[str, str]:
    """``"<team>::<member>"`` -> ``(team, member)``. The member part is what
    follows the **last** separator, so nested team names containing ``::`` still
    split correctly. Raises ``ValueError`` when there is no separator."""
    team, sep, member = value.rpartition(SEPARATOR)
    if not sep or not team or not member:
        raise ValueError(f"not a team mailbox id (expected '<team>::<member>'): {value!r}")
    return team, member


def new_work_item_id() -> str:
    """A fresh work item id, ``"wi_<32 hex>"``. One accepted handoff (or ask)
    is one work item; its reply and reports carry the same id."""
    return f"wi_{uuid.uuid4().hex}"


__all__ = ["LEAD", "SEPARATOR", "lead_mailbox_id", "mailbox_id", "new_work_item_id", "split_mailbox_id"]
