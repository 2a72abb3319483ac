"""Team members: a name, an agent-like target, and an optional role and focus.

``team_member(name=, agent=, role=, focus=)`` (docs/tutorial.md, section 2);
``agent`` accepts any agent-like target, a team included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigError
from ..tools.tool import TOOL_NAME_PATTERN
from .ids import LEAD

MemberKind = Literal["spec", "agent", "team", "host"]

#: Names a member may not take: the lead's mailbox name, the member mailbox
#: tools (the lead may be given them) and the structured-output tool.
RESERVED_MEMBER_NAMES = frozenset(
    {
        LEAD,
        "team_send",
        "team_inbox",
        "team_read",
        "team_reply",
        "team_followup",
        "team_status",
        "submit_output",
    }
)


_TEAM_TYPES: list[type] = []
"""The team classes (``team.py`` registers ``Team``; this module cannot import it)."""


def register_team_type(cls: type) -> None:
    """Make :func:`agent_kind` classify instances of ``cls`` as ``"team"``."""
    if cls not in _TEAM_TYPES:
        _TEAM_TYPES.append(cls)


def agent_kind(agent: Any) -> MemberKind | None:
    """:func:`member_kind` of ``agent``, or ``None`` where it raises."""
    from ..agent.agent import Agent, is_agent_spec

    if is_agent_spec(agent):
        return "spec"
    if isinstance(agent, tuple(_TEAM_TYPES)):
        return "team"
    if isinstance(agent, Agent):
        return "agent"
    if callable(getattr(agent, "prompt", None)) or callable(getattr(agent, "query", None)):
        return "host"
    return None


def member_kind(agent: Any) -> MemberKind:
    """How the runtime drives ``agent``:

    * ``"spec"`` -- an ``AgentSpec`` (``define_agent``): a fresh session per work item;
    * ``"agent"`` -- a live ``Agent``: one session, gets the member mailbox tools;
    * ``"team"`` -- a nested :class:`~lattice_worker.team.team.Team`;
    * ``"host"`` -- any other object with ``prompt()`` or ``query()``: its final
      text becomes the reply.

    Raises :class:`ConfigError` for anything else.
    """
    kind = agent_kind(agent)
    if kind is not None:
        return kind
    raise ConfigError(
        f"team member agent must be an Agent, an AgentSpec, a Team or an object with prompt()/query(), "
        f"got {type(agent).__name__}"
    )


@dataclass(frozen=True)
class TeamMember:
    """One named member of a team.

    Attributes:
        name: the member's name; it is also the lead's tool name for this member
            and the last part of its mailbox id ``"<team>::<name>"``. Must match
            ``^[a-zA-Z0-9_-]{1,64}$`` and not be ``"lead"`` or a team tool name.
        agent: an ``Agent``, an ``AgentSpec``, a ``Team`` or any AgentLike.
        role: free text shown to the lead (e.g. ``"executor"``), or ``None``.
        focus: free text shown to the lead (e.g. ``"Research agent architecture"``), or ``None``.

    Raises :class:`ConfigError` on an invalid name, role, focus or agent.
    """

    name: str
    agent: Any
    role: str | None = None
    focus: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not TOOL_NAME_PATTERN.match(self.name):
            raise ConfigError(
                f"team_member: invalid name {self.name!r}; a member name is also a tool name and must match "
                "^[a-zA-Z0-9_-]{1,64}$"
            )
        if self.name in RESERVED_MEMBER_NAMES:
            raise ConfigError(f'team_member: the name "{self.name}" is reserved; choose another member name')
        for field_name in ("role", "focus"):
            value = getattr(self, field_name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(
                    f'team_member("{self.name}"): {field_name} must be a string or None, got {type(value).__name__}'
                )
        # ``agent`` cannot be rebound (frozen), so its kind is fixed: computed once here
        # (the distributed runtime reads it several times per work item).
        object.__setattr__(self, "_kind", member_kind(self.agent))

    @property
    def kind(self) -> MemberKind:
        """See :func:`member_kind`."""
        return self._kind  # type: ignore[attr-defined, no-any-return]

    @property
    def accepts_tools(self) -> bool:
        """True when the member's runs get the mailbox tools (an ``Agent`` or an ``AgentSpec``)."""
        return self.kind in ("spec", "agent")

    def describe(self) -> str:
        """One line for tool descriptions: ``name (role) -- focus``."""
        text = self.name
        if self.role:
            text += f" ({self.role})"
        if self.focus:
            text += f" -- {self.focus}"
        return text


def team_member(
    *, name: str, agent: Any, role: str | None = None, focus: str | None = None, **unknown: Any
) -> TeamMember:
    """Declare a team member (docs/tutorial.md, section 2).

    Keyword-only: ``name``, ``agent`` (``Agent`` | ``AgentSpec`` | ``Team`` | AgentLike),
    ``role`` and ``focus`` (optional text). Raises :class:`ConfigError` on an
    unknown keyword, an invalid name (see :class:`TeamMember`) or agent.
    """
    for key in unknown:
        raise ConfigError(f'team_member: unknown option "{key}"; expected name, agent, role, focus')
    return TeamMember(name=name, agent=agent, role=role, focus=focus)


__all__ = ["MemberKind", "RESERVED_MEMBER_NAMES", "TeamMember", "member_kind", "team_member"]
