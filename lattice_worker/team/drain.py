"""Manual draining of a team's member mailboxes.

``drain()`` iterates members, claims
messages from each member's own mailbox and prompts that member; it never
chooses a different member or reroutes work. A member that ends without
``team_reply`` / ``team_followup`` fails its message and a diagnostic goes
upstream (see :func:`~lattice_worker.team.work.run_work_item`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..tracing.base import TraceContext
from .events import TeamMessageEvent
from .ids import mailbox_id
from .mailbox_state import EmitFn, emit_event
from .shape import TeamShape
from .work import WorkItemOutcome, run_work_item

if TYPE_CHECKING:
    from ..agent.abort import AbortSignal
    from ..tracing.base import ContextTracer


@dataclass(frozen=True)
class DrainResult:
    """What a drain did.

    ``processed``: messages claimed and run (every outcome); ``failed``: those
    that ended ``failed`` or ``cancelled``; ``rounds``: rounds that processed at
    least one message.
    """

    processed: int
    failed: int
    rounds: int


def _positive(where: str, name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{where}: {name} must be a positive integer, got {value!r}")
    return value


async def drain_team(
    team: TeamShape,
    *,
    max_rounds: int = 10,
    max_messages: int = 100,
    signal: AbortSignal | None = None,
    members: Iterable[str] | None = None,
    emit: EmitFn | None = None,
    tracer: ContextTracer | None = None,
    trace_context: TraceContext | None = None,
    on_outcome: Any = None,
) -> DrainResult:
    """Drain ``team``'s member mailboxes (see ``Team.drain``).

    Each round visits the selected members in team order and claims at most one
    message from each member's own mailbox (``"<team>::<member>"``), running
    that member on it. Stops after ``max_rounds`` rounds or ``max_messages``
    messages (both positive ints), when a round finds nothing to claim, or when
    ``signal`` is aborted. ``members`` limits the drain to those names.
    ``emit`` receives team events; ``on_outcome(outcome)`` (sync or async) each
    :class:`WorkItemOutcome`. ``tracer`` defaults to the team's ``tracer``.

    Raises :class:`ConfigError` on a bad limit, a ``members`` value that is not
    a name or a list of names, or an unknown member name (before anything is
    claimed).
    """
    where = f'team "{team.name}".drain'
    max_rounds = _positive(where, "max_rounds", max_rounds)
    max_messages = _positive(where, "max_messages", max_messages)
    if members is None:
        selected = list(team.members)
    else:
        if isinstance(members, str):
            members = [members]
        if not isinstance(members, Iterable):
            raise ConfigError(f"{where}: members must be a member name or a list of names, got {members!r}")
        names = list(members)
        for name in names:
            if not isinstance(name, str):
                raise ConfigError(f"{where}: members must be member names (str), got {name!r}")
        selected = [team.member(name) for name in names]
    if tracer is None:
        tracer = getattr(team, "tracer", None)
    mailbox = team.mailbox
    processed = failed = rounds = 0
    while rounds < max_rounds and processed < max_messages:
        if signal is not None and signal.aborted:
            break
        claimed_this_round = 0
        for member in selected:
            if processed >= max_messages or (signal is not None and signal.aborted):
                break
            box = mailbox_id(team.name, member.name)
            async with team.mailbox_lock(box):
                message = await mailbox.claim_next(box)
                if message is None:
                    continue
                public = message.model_copy(update={"claim_token": None}).to_json_dict()
                await emit_event(emit, TeamMessageEvent(subtype="claimed", team=team.name, message=public))
                token = message.claim_token if callable(getattr(mailbox, "complete", None)) else None
                outcome: WorkItemOutcome = await run_work_item(
                    team,
                    member,
                    message,
                    mailbox=mailbox,
                    token=token,
                    signal=signal,
                    tracer=tracer,
                    trace_context=trace_context,
                    emit=emit,
                )
            claimed_this_round += 1
            processed += 1
            if outcome.status in ("failed", "cancelled"):
                failed += 1
            if on_outcome is not None:
                await emit_event(on_outcome, outcome)
        if claimed_this_round == 0:
            break
        rounds += 1
    return DrainResult(processed=processed, failed=failed, rounds=rounds)


__all__ = ["DrainResult", "drain_team"]
