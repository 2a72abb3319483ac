"""The team registry: load team definitions by reference or by name.

docs/architecture.md. Workers and the client name a
team by ``"package.module:attribute"`` -- the attribute is a
:class:`~lattice_worker.team.team.Team` or a zero-argument callable returning
one -- or by a name registered with :func:`register_team`.

The same definition runs embedded or distributed: a :class:`TeamRegistry`
keeps, for every loaded team, a *rebound copy* whose ``mailbox`` is the
worker's mailbox store (the Redis mailbox from the settings), built with
``create_team`` from the original's lead spec, members, runner options and
tracer. The original is never modified. Nested teams (a member whose agent is a
``Team``) are rebound and registered under their own names too: in the
distributed runtime a nested team runs as its own lead run (traced by its
parent's tracer when it has none of its own).

Rules checked when a team is loaded -- a clear :class:`ConfigError` at worker
start rather than a failure in the middle of a run:

* the lead must be an ``AgentSpec`` (``define_agent``; ``create_team`` keeps
  it as ``team.lead_spec``), because every run spawns its own lead session;
* two different team objects may not share a name.

Member modes (:func:`member_mode`): an ``AgentSpec`` member is a
``"template"`` (a fresh session per work item; parallel across workers); a
live ``Agent`` or another AgentLike is a ``"session"`` member (serial per
mailbox: claimed with ``max_in_flight=1``; an ``Agent``'s history is kept in
Redis per mailbox); a ``Team`` member is ``"team"`` (a child run).

Workers publish ``{ref -> name, name -> name}`` (:meth:`TeamRegistry.publication`)
in their entry of the live registry (:mod:`lattice_client.registry`, written by
:mod:`lattice_worker.runtime.worker.heartbeat`); the client resolves names and
references through it. A worker runs only the teams its registry loaded at
start (:class:`TeamNotServedError` otherwise); nothing a run record names is
ever imported.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from lattice_client.errors import describe_module_error

from ...errors import ConfigError, TeamNotServedError
from ...team.ids import LEAD
from ...team.member import TeamMember
from ...team.team import Team, create_team

TEAMS_ENV = "LATTICE_WORKER_TEAMS"
"""Environment variable holding the comma-separated team references a worker
process serves (set by ``lattice worker`` so pool processes, however they are
started, load the same teams)."""

_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")

_named: dict[str, Team | Callable[[], Team]] = {}
_named_lock = threading.Lock()


def register_team(team_or_name: Team | str, team: Team | Callable[[], Team] | None = None) -> None:
    """Register a team under a name, so workers and the client can use the name
    instead of a reference.

    ``register_team(team)`` registers ``team`` under ``team.name``;
    ``register_team("alias", team_or_factory)`` under ``"alias"`` (a factory is
    a zero-argument callable returning a ``Team``, called on first load).
    Raises :class:`ConfigError` on a bad name or object, or when the name is
    taken by a different object.
    """
    if team is None:
        if not isinstance(team_or_name, Team):
            raise ConfigError(f"register_team: expected a Team, got {type(team_or_name).__name__}")
        name, obj = team_or_name.name, team_or_name
    else:
        if not isinstance(team_or_name, str) or not team_or_name or ":" in team_or_name:
            raise ConfigError(f"register_team: invalid name {team_or_name!r} (non-empty, no ':')")
        if not (isinstance(team, Team) or callable(team)):
            raise ConfigError(f"register_team: expected a Team or a factory, got {type(team).__name__}")
        name, obj = team_or_name, team
    with _named_lock:
        current = _named.get(name)
        if current is not None and current is not obj:
            raise ConfigError(f'register_team: the name "{name}" is already registered to another team')
        _named[name] = obj


def unregister_team(name: str) -> None:
    """Forget a registered name (tests)."""
    with _named_lock:
        _named.pop(name, None)


def _ensure_cwd_importable() -> None:
    # `lattice worker pkg.mod:team` runs from a console script whose sys.path[0] is
    # the script's directory; team modules usually live in the current directory.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def import_team(ref_or_name: str) -> Team:
    """The ``Team`` a reference or registered name designates (the original,
    not rebound).

    Raises :class:`ConfigError` when the name is unknown, the reference is
    malformed or cannot be imported, or the object is not a ``Team`` (nor a
    zero-argument callable returning one)."""
    if not isinstance(ref_or_name, str) or not ref_or_name.strip():
        raise ConfigError(
            "team reference must be a non-empty 'package.module:attribute' or a registered name"
        )
    with _named_lock:
        obj: Any = _named.get(ref_or_name)
    if obj is None:
        if ":" not in ref_or_name:
            known = ", ".join(sorted(_named)) or "(none)"
            hint = (
                f"; a reference needs ':attribute', e.g. '{ref_or_name}:team'" if "." in ref_or_name else ""
            )
            raise ConfigError(
                f"unknown team {ref_or_name!r}: not a registered name (registered: {known}) and not a "
                f"'package.module:attribute' reference{hint}"
            )
        if not _REF.match(ref_or_name):
            raise ConfigError(f"invalid team reference {ref_or_name!r}: expected 'package.module:attribute'")
        module_name, _, attribute = ref_or_name.partition(":")
        _ensure_cwd_importable()
        try:
            obj = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(f"cannot import team module {module_name!r} of {ref_or_name!r}: {exc}") from exc
        except Exception as exc:  # the module raised while it was imported
            raise ConfigError(describe_module_error(module_name, exc)) from exc
        for part in attribute.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise ConfigError(
                    f"team reference {ref_or_name!r}: {module_name} has no attribute {attribute!r}"
                ) from None
    if not isinstance(obj, Team) and callable(obj):
        try:
            obj = obj()
        except Exception as exc:  # the team factory raised
            raise ConfigError(describe_module_error(ref_or_name.partition(":")[0], exc)) from exc
    if not isinstance(obj, Team):
        raise ConfigError(
            f"team reference {ref_or_name!r} is a {type(obj).__name__}, not a Team "
            "(or a zero-argument callable returning one)"
        )
    return obj


class TeamRegistry:
    """The teams one worker process serves, rebound to its mailbox store.

    ``mailbox``: the store every rebound team uses (a ``RedisMailbox`` in
    workers; any ``TeamMailbox`` in tests). :meth:`load` imports a team and
    its nested teams; :meth:`get` / :meth:`require` look them up by name.
    """

    def __init__(self, mailbox: Any) -> None:
        self.mailbox = mailbox
        self._teams: dict[str, Team] = {}
        self._originals: dict[str, Team] = {}
        self._refs: dict[str, str] = {}
        self._parents: dict[str, tuple[str, str]] = {}
        self._lock = threading.RLock()

    # -- loading ------------------------------------------------------------------

    def load(self, ref_or_name: str) -> Team:
        """Import (or look up) a team, check it can run distributed, rebind it
        and its nested teams to this registry's mailbox; returns the rebound
        root team. Loading the same reference twice returns the same copy.
        Raises :class:`ConfigError` (see the module doc)."""
        with self._lock:
            name = self._refs.get(ref_or_name)
            if name is not None:
                return self._teams[name]
            original = import_team(ref_or_name)
            rebound = self.add(original)
            self._refs[ref_or_name] = rebound.name
            return rebound

    def add(self, team: Team) -> Team:
        """Check and rebind ``team`` (and its nested teams); returns the copy."""
        with self._lock:
            return self._rebind(team, set())

    def _rebind(self, team: Team, visiting: set[int], inherited_tracer: Any = None) -> Team:
        # a nested team without a tracer of its own gets its parent's, as
        # team.query(tracer=...) passes it down in-process
        if not isinstance(team, Team):
            raise ConfigError(f"expected a Team, got {type(team).__name__}")
        known = self._originals.get(team.name)
        if known is not None:
            if known is not team:
                raise ConfigError(
                    f'two different teams are named "{team.name}"; team names must be unique across the teams a '
                    "worker serves (mailbox ids and queues are named after them)"
                )
            return self._teams[team.name]
        if id(team) in visiting:
            raise ConfigError(f'team "{team.name}" contains itself')
        if team.lead_spec is None:
            raise ConfigError(
                f'team "{team.name}": the lead must be an AgentSpec (define_agent(...)) to run distributed -- '
                "every run spawns its own lead session, possibly in another process; a live Agent lead "
                f"({team.lead!r}) cannot be copied there"
            )
        visiting = visiting | {id(team)}
        tracer = team.tracer if team.tracer is not None else inherited_tracer
        members: list[TeamMember] = []
        for member in team.members:
            agent = member.agent
            if member.kind == "team":
                agent = self._rebind(agent, visiting, tracer)
                self._parents[agent.name] = (team.name, member.name)
            members.append(TeamMember(name=member.name, agent=agent, role=member.role, focus=member.focus))
        rebound = create_team(
            name=team.name,
            lead=team.lead_spec,
            members=members,
            mailbox=self.mailbox,
            runner=team.runner_options,
            expose_lead_mailbox_tools=team.expose_lead_mailbox_tools,
            tracer=tracer,
            budget={"tokens": team.budget_tokens} if team.budget_tokens is not None else None,
        )
        self._originals[team.name] = team
        self._teams[team.name] = rebound
        return rebound

    def load_published(self, name: str, published: Mapping[str, str]) -> Team:
        """Load team ``name`` through the references live workers published
        (``published``: ``{ref -> name, name -> name}``, see
        :meth:`lattice_client.registry.LiveRegistry.mapping`) -- for a team registered by name in a worker
        process but not in this one. A reference published for ``name`` is
        loaded; a nested team (published by name only) is found by loading, in
        a scratch registry, each published reference until one holds it.
        Returns the rebound team. Raises :class:`ConfigError` naming the
        published teams when none is ``name`` (or its reference cannot be
        imported here)."""
        refs = sorted(r for r in published if _REF.match(r))
        direct = [r for r in refs if published[r] == name]
        for ref in direct:
            self.load(ref)
            team = self.get(name)
            if team is not None:
                return team
        if name in published.values():
            for ref in [r for r in refs if r not in direct]:
                probe = TeamRegistry(self.mailbox)
                try:
                    probe.load(ref)
                except ConfigError:
                    continue
                if probe.get(name) is not None:
                    self.load(ref)
                    return self.require(name)
        known = ", ".join(sorted(set(published.values()))) or "(none)"
        raise ConfigError(
            f"unknown team {name!r}: not a registered name in this process, and no reference published by a "
            f"worker loads it (published teams: {known})"
        )

    # -- lookups ------------------------------------------------------------------

    def get(self, name: str) -> Team | None:
        """The rebound team called ``name`` (root or nested), or ``None``."""
        return self._teams.get(name)

    def require(self, name: str) -> Team:
        """Like :meth:`get`; raises :class:`ConfigError` naming the known teams."""
        team = self._teams.get(name)
        if team is None:
            known = ", ".join(sorted(self._teams)) or "(none)"
            raise ConfigError(f'team "{name}" is not served by this worker (teams: {known})')
        return team

    def names(self) -> list[str]:
        """Every loaded team name (roots and nested), sorted."""
        return sorted(self._teams)

    def refs(self) -> dict[str, str]:
        """``{reference or name used with load -> team name}``."""
        return dict(self._refs)

    def teams(self) -> list[Team]:
        """Every loaded (rebound) team."""
        return [self._teams[n] for n in sorted(self._teams)]

    def descendants(self, name: str) -> list[Team]:
        """The loaded teams nested (at any depth) in team ``name``, depth first."""
        out: list[Team] = []
        team = self._teams.get(name)
        for member in team.members if team is not None else []:
            if member.kind == "team" and member.agent.name not in {t.name for t in out}:
                out.append(member.agent)
                out += [t for t in self.descendants(member.agent.name) if t not in out]
        return out

    def member(self, team_name: str, member_name: str) -> TeamMember | None:
        """The member ``member_name`` of loaded team ``team_name``, or ``None``."""
        team = self._teams.get(team_name)
        if team is None:
            return None
        for member in team.members:
            if member.name == member_name:
                return member
        return None

    def queues(self, prefix: str, members: Iterable[str] | None = None) -> list[str]:
        """The Celery queues of the loaded teams, ``"<prefix>.<team>.<member>"``.

        Without ``members``: every team's lead queue and every member queue.
        With ``members``: only those names (``"lead"`` = the lead queues), in
        any loaded team that has them. Raises :class:`ConfigError` for a name no
        loaded team has."""
        from lattice_client.celery_config import queue_name

        wanted = list(members) if members is not None else None
        found: set[str] = set()
        queues: list[str] = []
        for team in self.teams():
            names = [LEAD, *(m.name for m in team.members)]
            for name in names:
                if wanted is None or name in wanted:
                    found.add(name)
                    queue = queue_name(prefix, team.name, name)
                    if queue not in queues:
                        queues.append(queue)
        if wanted is not None:
            missing = [m for m in wanted if m not in found]
            if missing:
                available = ", ".join(sorted({LEAD, *(m.name for t in self.teams() for m in t.members)}))
                raise ConfigError(f"unknown member(s) {', '.join(missing)}; this team has: {available}")
        return queues

    def serving(self, name: str, worker: str) -> Team:
        """The rebound team ``name`` this worker serves; raises
        :class:`TeamNotServedError` (naming the team and ``worker``) otherwise.
        Never imports anything."""
        team = self._teams.get(name) if isinstance(name, str) else None
        if team is None:
            raise TeamNotServedError(str(name), worker, self._teams)
        return team

    def mailbox_ids(self) -> list[str]:
        """Every member mailbox id (``team::member``) of the loaded teams, sorted."""
        return sorted(team.mailbox_id(m.name) for team in self._teams.values() for m in team.members)

    def publication(self) -> dict[str, str]:
        """What the worker publishes in the live registry: ``{ref -> name}`` for every loaded
        reference plus ``{name -> name}`` for every team (nested ones included)."""
        mapping = {name: name for name in self._teams}
        mapping.update(self._refs)
        return mapping


def refs_from_env() -> list[str]:
    """The team references in ``LATTICE_WORKER_TEAMS`` (comma-separated)."""
    raw = os.environ.get(TEAMS_ENV, "")
    return [part.strip() for part in raw.split(",") if part.strip()]


__all__ = [
    "TEAMS_ENV",
    "TeamRegistry",
    "import_team",
    "refs_from_env",
    "register_team",
    "unregister_team",
]
