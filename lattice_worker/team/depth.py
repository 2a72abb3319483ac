"""Delegation depth: how deep agents may delegate to agents.

The root agent of a query runs at depth 0. A child run by ``agent_tool`` /
``delegate_tool`` (``ask``) or a team member working on a message runs one
level deeper than the agent that delegated to it; a nested team's lead runs
at its member's depth, its members one deeper. A delegation that would run
deeper than the limit is refused with an error tool result (nothing runs,
nothing is sent), so an agent that can reach itself cannot recurse without
end.

The limit is ``RunnerOptions.max_delegate_depth`` of the team whose runtime
drives the query (the tightest one when teams are nested), else
:data:`DEFAULT_MAX_DELEGATE_DEPTH`. Depth and limit travel in context
variables (so tasks and tool calls started by a run inherit them); a team
task message carries its depth in ``metadata["delegate_depth"]`` and the limit
in effect where it was sent in ``metadata["delegate_limit"]``, which the member
run -- in this process or in a worker -- starts from; a nested team's child run
in a worker starts its lead from the same two (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ..errors import ToolExecutionError

DEFAULT_MAX_DELEGATE_DEPTH = 3
"""Deepest delegation allowed when no team runtime sets one: the root agent (0)
may delegate to a child (1), which may delegate (2), which may delegate once
more (3). Deep enough for a lead, its members and their own helpers or a
nested team; shallow enough that a runaway self-delegation stops quickly."""

DEPTH_METADATA_KEY = "delegate_depth"
"""The team task message metadata key holding the depth its member runs at."""

LIMIT_METADATA_KEY = "delegate_limit"
"""The team task message metadata key holding the delegation limit in effect
where the message was sent (the tightest of the sender's and its team's)."""

_depth: ContextVar[int] = ContextVar("lattice_delegate_depth", default=0)
_limit: ContextVar[int | None] = ContextVar("lattice_delegate_limit", default=None)


def current_depth() -> int:
    """The delegation depth of the running agent (0 for the root)."""
    return _depth.get()


def current_limit() -> int:
    """The limit in effect (a runtime's ``max_delegate_depth``, else the default)."""
    limit = _limit.get()
    return DEFAULT_MAX_DELEGATE_DEPTH if limit is None else limit


def limit_in_effect() -> int | None:
    """The limit a runtime (or a message) set for the running agent, ``None``
    when none did (then :func:`current_limit` is the default)."""
    return _limit.get()


def effective_limit(limit: int | None = None) -> int:
    """The limit a delegation under ``limit`` (a team's ``max_delegate_depth``;
    ``None``: none of its own) is held to: the tightest of it and :func:`current_limit`."""
    return current_limit() if limit is None else min(limit, current_limit())


def next_depth(where: str, limit: int | None = None) -> int:
    """The depth a delegation from the running agent would run at.

    ``limit``: a limit of the delegating tool's own (a team's
    ``max_delegate_depth``); the tightest of it and :func:`current_limit`
    applies. Raises :class:`ToolExecutionError` (an error tool result saying
    so; nothing ran) when that depth is beyond the limit.
    """
    depth = _depth.get() + 1
    effective = effective_limit(limit)
    if depth > effective:
        raise ToolExecutionError(
            f"{where}: refused -- delegation depth limit reached. This call would run an agent at "
            f"delegation depth {depth}, beyond max_delegate_depth={effective} (RunnerOptions). "
            "Nothing was run or sent: do this task yourself, or return to the agent that delegated "
            "it to you."
        )
    return depth


@contextmanager
def delegated(depth: int) -> Iterator[None]:
    """Run the block (a child or member run) at delegation depth ``depth``."""
    token = _depth.set(depth)
    try:
        yield
    finally:
        _depth.reset(token)


@contextmanager
def delegation_limit(limit: int | None) -> Iterator[None]:
    """Run the block under ``limit`` (or the tighter limit already in effect;
    ``None`` changes nothing)."""
    current = _limit.get()
    if limit is None or (current is not None and current < limit):
        limit = current
    token = _limit.set(limit)
    try:
        yield
    finally:
        _limit.reset(token)


def _count(value: object, smallest: int) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= smallest:
        return value
    return None


def metadata_depth(metadata: dict[str, object]) -> int | None:
    """The depth ``metadata[DEPTH_METADATA_KEY]`` names (an integer >= 0), else ``None``."""
    return _count(metadata.get(DEPTH_METADATA_KEY), 0)


def metadata_limit(metadata: dict[str, object]) -> int | None:
    """The limit ``metadata[LIMIT_METADATA_KEY]`` names (an integer >= 1), else ``None``."""
    return _count(metadata.get(LIMIT_METADATA_KEY), 1)


__all__ = [
    "DEFAULT_MAX_DELEGATE_DEPTH",
    "DEPTH_METADATA_KEY",
    "LIMIT_METADATA_KEY",
    "current_depth",
    "current_limit",
    "delegated",
    "delegation_limit",
    "effective_limit",
    "limit_in_effect",
    "metadata_depth",
    "metadata_limit",
    "next_depth",
]
