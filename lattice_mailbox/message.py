"""The message record every mailbox store persists, and its status values.

Fields and status values are described in
docs/architecture.md, "Core model". ``created_at`` and ``lease_until`` are **milliseconds**
since the Unix epoch.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class MessageStatus(StrEnum):
    """Where a message is in the mailbox state machine.

    ``pending`` -> (``claim_next``) -> ``processing`` -> (``update_status``) ->
    ``done`` | ``failed`` | ``cancelled`` | ``read``. ``parked`` means a person
    must decide (crash-safe tool calls). ``done``, ``failed`` and ``cancelled``
    are terminal: a message never leaves them.
    """

    PENDING = "pending"
    PROCESSING = "processing"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    READ = "read"
    PARKED = "parked"

    @property
    def terminal(self) -> bool:
        """True for ``done``, ``failed`` and ``cancelled``."""
        return self in TERMINAL_STATUSES

    @classmethod
    def parse(cls, value: MessageStatus | str) -> MessageStatus:
        """Accept a member or its string value; raise ``ValueError`` naming the
        valid values otherwise."""
        if isinstance(value, MessageStatus):
            return value
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(s.value for s in cls)
            raise ValueError(f"unknown message status {value!r}; expected one of: {valid}") from None


TERMINAL_STATUSES = frozenset({MessageStatus.DONE, MessageStatus.FAILED, MessageStatus.CANCELLED})


class TeamMessage(BaseModel):
    """One message in a team mailbox.

    ``from_`` is serialised as ``from`` (``model_dump(by_alias=True)``).
    ``to`` is the destination mailbox id (``"<team>::<member>"``).
    ``thread_id`` defaults to the message's own id. ``claimed_by``,
    ``lease_until`` (ms since epoch) and ``attempts`` are filled by stores that
    support leases; ``claim_token`` is set only on the copy ``claim_next``
    returns and must be presented to ``extend_lease`` and to fenced
    ``update_status`` calls.
    """

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    id: str
    from_: str = Field(alias="from")
    to: str
    content: str
    status: MessageStatus = MessageStatus.PENDING
    created_at: int
    thread_id: str | None = None
    work_item_id: str | None = None
    reply_to: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    claimed_by: str | None = None
    lease_until: int | None = None
    attempts: int = 0
    claim_token: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """A JSON-ready dict using the wire name ``from``."""
        return self.model_dump(mode="json", by_alias=True)


__all__ = ["MessageStatus", "TeamMessage", "TERMINAL_STATUSES"]
