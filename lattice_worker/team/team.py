"""``create_team`` and the agent-like :class:`Team`.

Guide: docs/tutorial.md; design: docs/architecture.md, "Teams in one process".
A team is not a new kind of agent: calling it means talking to its lead,
whose member tools put work in member mailboxes that the runner (or
``drain``) drives to completion.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

from lattice_mailbox.base import TeamMailbox

from ..errors import ConfigError, LatticeError
from .drain import DrainResult, drain_team
from .ids import lead_mailbox_id, mailbox_id
from .lead_tools import make_lead_member_tools
from .member import TeamMember, register_team_type
from .member_tools import ensure_mailbox_tools, make_mailbox_tools
from .reports import TeamResultMessage
from .runner import RunnerOptions, TeamRunner, runner_options

if TYPE_CHECKING:
    from ..agent.abort import AbortSignal

_TEAM_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_MAILBOX_METHODS = ("send", "inbox", "get", "claim_next", "update_status")
_DRAIN_OPTIONS = ("emit", "tracer", "trace_context", "on_outcome")


class Team:
    """A lead plus named members behind one mailbox store; agent-like.

    Build it with :func:`create_team`. Attributes: ``name``, ``lead`` (the lead
    ``Agent``), ``lead_spec`` (the ``AgentSpec`` it was spawned from, or
    ``None``), ``members`` (list of :class:`TeamMember`), ``mailbox`` (the
    ``TeamMailbox``), ``runner_options`` (:class:`RunnerOptions`),
    ``expose_lead_mailbox_tools``, ``tracer`` (the team's ``ContextTracer`` or ``None``).
    """

    def __init__(
        self,
        *,
        name: str,
        lead: Any,
        lead_spec: Any,
        members: list[TeamMember],
        mailbox: TeamMailbox,
        runner_options: RunnerOptions,
        expose_lead_mailbox_tools: bool,
        tracer: Any = None,
        budget_tokens: int | None = None,
    ) -> None:
        self.name = name
        self.budget_tokens = budget_tokens
        """The default token budget of the team's distributed runs (``None``: none)."""
        self.lead = lead
        self.lead_spec = lead_spec
        self.members = members
        self.mailbox = mailbox
        self.runner_options = runner_options
        self.expose_lead_mailbox_tools = expose_lead_mailbox_tools
        self.tracer = tracer
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"Team(name={self.name!r}, members={[m.name for m in self.members]!r})"

    # -- lookups ------------------------------------------------------------------

    def member(self, name: str) -> TeamMember:
        """The member called ``name``. Raises :class:`ConfigError` naming the known members."""
        for member in self.members:
            if member.name == name:
                return member
        known = ", ".join(m.name for m in self.members) or "(none)"
        raise ConfigError(f'team "{self.name}" has no member "{name}"; members: {known}')

    def mailbox_id(self, member_name: str) -> str:
        """``"<team>::<member>"`` (``"<team>::lead"`` for ``"lead"``)."""
        return mailbox_id(self.name, member_name)

    @property
    def lead_mailbox_id(self) -> str:
        """Where member reports arrive: ``"<team>::lead"``."""
        return lead_mailbox_id(self.name)

    @property
    def session_id(self) -> str | None:
        """The lead's session id."""
        return getattr(self.lead, "session_id", None)

    @property
    def output_schema(self) -> Any:
        """The lead's ``output_schema`` (what ``agent_tool`` inherits from a team)."""
        return getattr(self.lead, "output_schema", None)

    def mailbox_lock(self, box: str) -> asyncio.Lock:
        """The lock that keeps one mailbox serial inside this process (one per
        event loop, so a team can be used from several ``prompt_sync`` calls)."""
        loop = asyncio.get_running_loop()
        locks = self._locks.get(loop)
        if locks is None:
            locks = {}
            self._locks[loop] = locks
        lock = locks.get(box)
        if lock is None:
            lock = locks[box] = asyncio.Lock()
        return lock

    # -- agent-like -------------------------------------------------------------------

    def query(self, prompt: Any, /, **query_options: Any) -> AsyncIterator[Any]:
        """Talk to the lead.

        Yields the lead's SDK events (``system``, ``assistant``, ``user``, ...,
        one ``result``) merged with team events as they happen:
        ``team_message`` / ``team_agent`` (:mod:`lattice_worker.team.events`) and
        ``agent_message`` (each member SDK event, wrapped). Handoffs of a tool
        batch run before the lead's next model request.

        ``query_options``: the lead's query options (``signal``, ``stream``,
        ``tracer``...). ``signal`` and ``stream`` also apply to member runs; a
        ``tracer`` (default: the team's own, see :func:`create_team`) traces
        the whole team under one root run.
        Raises :class:`ConfigError` for bad options (on first iteration).
        """
        return TeamRunner(self, self.runner_options).query(prompt, **query_options)

    async def prompt(self, prompt: Any, /, **query_options: Any) -> TeamResultMessage:
        """Run :meth:`query` and return its final
        :class:`~lattice_worker.team.reports.TeamResultMessage` (the lead's
        ``ResultMessage`` plus ``work_items`` and ``failed_work_items``).

        A failed member work item does not make this raise: the lead gets a
        failure report and decides, and ``result.failed_work_items`` names it
        (member, work item, error code such as ``no_reply`` for a member that
        answered without ``team_reply``). Error subtypes of the lead are
        returned, not raised (``result.raise_for_error()``).
        """
        result = None
        stream = self.query(prompt, **query_options)
        try:
            async for event in stream:
                if getattr(event, "type", None) == "result":
                    result = event
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        if result is None:  # pragma: no cover - the lead always ends with a result
            raise LatticeError(f'team "{self.name}": the lead ended without a result')
        return result

    def prompt_sync(self, prompt: Any, /, **query_options: Any) -> TeamResultMessage:
        """Blocking :meth:`prompt` (runs its own event loop). Raises ``RuntimeError``
        inside a running event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.prompt(prompt, **query_options))
        raise RuntimeError(
            "prompt_sync() cannot run inside a running event loop; use `await team.prompt(...)`"
        )

    def interrupt(self) -> bool:
        """Interrupt the lead's running query (see ``Agent.interrupt``): accepted
        handoffs of the current batch still finish and are recorded. Returns
        ``False`` when the team is idle."""
        return bool(self.lead.interrupt())

    async def drain(
        self,
        *,
        max_rounds: int = 10,
        max_messages: int = 100,
        signal: AbortSignal | None = None,
        members: Iterable[str] | None = None,
        **options: Any,
    ) -> DrainResult:
        """Process member mailboxes by hand.

        See :func:`~lattice_worker.team.drain.drain_team`: each round claims at
        most one message from each member's own mailbox and prompts that member;
        nothing is rerouted. Stops after ``max_rounds`` rounds, ``max_messages``
        messages, an empty round, or an abort. ``options``: ``emit``, ``tracer``,
        ``trace_context``, ``on_outcome`` (see ``drain_team``). Raises
        :class:`ConfigError` on a limit that is not a positive int, an unknown
        member name or an unknown option (before anything is claimed).
        """
        for key in options:
            if key not in _DRAIN_OPTIONS:
                raise ConfigError(
                    f'team "{self.name}".drain: unknown option "{key}"; expected max_rounds, max_messages, '
                    f"signal, members, {', '.join(_DRAIN_OPTIONS)}"
                )
        return await drain_team(
            self, max_rounds=max_rounds, max_messages=max_messages, signal=signal, members=members, **options
        )


def _check_mailbox(mailbox: Any) -> TeamMailbox:
    missing = [m for m in _MAILBOX_METHODS if not callable(getattr(mailbox, m, None))]
    if missing:
        raise ConfigError(
            f"create_team: mailbox must implement the TeamMailbox protocol; {type(mailbox).__name__} lacks "
            + ", ".join(missing)
        )
    return mailbox


def create_team(
    *,
    name: str,
    lead: Any,
    members: Iterable[TeamMember] = (),
    mailbox: TeamMailbox | None = None,
    runner: RunnerOptions | dict[str, Any] | None = None,
    expose_lead_mailbox_tools: bool = False,
    tracer: Any = None,
    budget: dict[str, int] | None = None,
    **unknown: Any,
) -> Team:
    """Create a mailbox team (docs/tutorial.md).

    Args:
        name: the team name, ``^[A-Za-z0-9_.-]{1,64}$``; mailbox ids are ``"<name>::<member>"``.
        lead: an ``Agent`` (or an ``AgentSpec``, spawned once). It gets one tool per
            member (named as the member) and, with ``expose_lead_mailbox_tools``,
            the six ``team_*`` mailbox tools.
        members: :class:`TeamMember` items (:func:`~lattice_worker.team.member.team_member`).
            Names must be unique.
        mailbox: any ``TeamMailbox`` store; default a new ``MemoryMailbox``.
        runner: :class:`RunnerOptions` or a dict (``max_concurrent_work_items``).
        expose_lead_mailbox_tools: give the lead the raw mailbox tools.
        tracer: the team's ``ContextTracer``: it traces every query of the team
            that passes no ``tracer`` of its own (one root run, the lead's and
            every member's runs under it, as ``team.query(tracer=...)``), every
            drain, and every distributed run of the team (one trace across
            workers and segments; see the README, "Tracing").
        budget: ``{"tokens": N}``, the default token budget of the team's
            distributed runs (a run submitted with a ``budget`` of its own keeps
            that one); a run parks as ``budget_reached`` when it spent it
            (docs/operate.md, "Budgets"). Default: none.

    Raises :class:`ConfigError` on an unknown keyword, an invalid name, a lead
    that is not an Agent/AgentSpec, a tracer without a callable ``on_event``,
    duplicate member names, a member that is the
    lead itself, a mailbox missing protocol methods, bad runner options, a
    ``budget`` other than ``{"tokens": positive int}``, or a
    tool name clash on the lead. Live ``Agent`` members get the mailbox tools now
    (clashes surface here).
    """
    from ..agent.agent import Agent, is_agent_spec

    for key in unknown:
        raise ConfigError(
            f'create_team: unknown option "{key}"; expected name, lead, members, mailbox, runner, '
            "expose_lead_mailbox_tools, tracer, budget"
        )
    if not isinstance(name, str) or not _TEAM_NAME.match(name):
        raise ConfigError(
            f"create_team: invalid name {name!r}; a team name must match ^[A-Za-z0-9_.-]{{1,64}}$"
        )
    where = f'create_team("{name}")'
    lead_spec = None
    if is_agent_spec(lead):
        lead_spec = lead
        lead = lead.spawn()
    elif not isinstance(lead, Agent):
        raise ConfigError(f"{where}: lead must be an Agent or an AgentSpec, got {type(lead).__name__}")
    if isinstance(members, TeamMember) or not isinstance(members, Iterable):
        raise ConfigError(f"{where}: members must be a list of team_member(...)")
    member_list = list(members)
    seen: set[str] = set()
    for i, member in enumerate(member_list):
        if not isinstance(member, TeamMember):
            raise ConfigError(
                f"{where}: member {i} is {type(member).__name__}, not a TeamMember (use team_member())"
            )
        if member.name in seen:
            raise ConfigError(f'{where}: duplicate member name "{member.name}"; member names must be unique')
        seen.add(member.name)
        if member.agent is lead:
            raise ConfigError(
                f'{where}: member "{member.name}" is the lead agent itself; use a separate agent'
            )
        if member.kind in ("agent", "team"):
            for other in member_list[:i]:
                if other.agent is member.agent:
                    raise ConfigError(
                        f'{where}: members "{other.name}" and "{member.name}" share one live session; one Agent '
                        "holds one conversation -- give each member its own agent, or use define_agent(...) for a "
                        "template that spawns a session per work item"
                    )
    if not isinstance(expose_lead_mailbox_tools, bool):
        raise ConfigError(f"{where}: expose_lead_mailbox_tools must be a bool")
    if tracer is not None and not callable(getattr(tracer, "on_event", None)):
        raise ConfigError(
            f"{where}: tracer must be a ContextTracer (an object with on_event(event)), got {type(tracer).__name__}"
        )
    options = runner_options(runner)
    budget_tokens = _budget_tokens(where, budget)
    if mailbox is None:
        from lattice_mailbox.memory import MemoryMailbox

        mailbox = MemoryMailbox()
    _check_mailbox(mailbox)

    team = Team(
        name=name,
        lead=lead,
        lead_spec=lead_spec,
        members=member_list,
        mailbox=mailbox,
        runner_options=options,
        expose_lead_mailbox_tools=expose_lead_mailbox_tools,
        tracer=tracer,
        budget_tokens=budget_tokens,
    )
    lead_tools = make_lead_member_tools(team)
    if expose_lead_mailbox_tools:
        lead_tools += make_mailbox_tools()
    try:
        for member in member_list:
            if member.kind == "agent":
                ensure_mailbox_tools(member.agent)
        lead.add_tools(lead_tools)  # last: a failed assembly leaves the lead untouched
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return team


def _budget_tokens(where: str, budget: Any) -> int | None:
    if budget is None:
        return None
    tokens = budget.get("tokens") if isinstance(budget, dict) and set(budget) == {"tokens"} else None
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ConfigError(
            f'{where}: budget must be {{"tokens": N}} with N a positive integer, got {budget!r}'
        )
    return tokens


register_team_type(Team)

__all__ = ["DrainResult", "Team", "create_team"]
