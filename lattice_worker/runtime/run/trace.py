"""One trace per distributed run, across its lead segments, workers and member deliveries.

Which tracer (nothing is traced, and nothing extra written or sent, without one):

* the run's own runs -- its team root and every lead segment's query: the
  team's ``tracer`` (``create_team(tracer=...)``), else the lead spec's
  ``tracer`` option (:func:`run_tracer`);
* a member delivery of a traced run: the team's ``tracer``, else the member
  agent's own ``tracer`` option (:func:`member_trace`), as a team query with a
  tracer does in one process.

How the trace travels with the run (the carrier is the ``dict[str, str]`` of
:func:`~lattice_worker.tracing.base.trace_carrier`: W3C ``traceparent``,
``langsmith-trace`` / ``langsmith-baggage``, ``langfuse-traceparent``; ``{}``
for tracers that propagate nothing):

* The first lead segment that traces the run (its record has no
  ``trace_carrier`` yet) opens the team root: trace run id and trace session
  = the run id, source ``{"kind": "team", "name": <team>}``. A child run (a
  nested team's) continues its parent run's trace: its root is a child of
  the parent's (the carrier its task message brought, kept in
  ``metadata["lattice_parent"]["trace_carrier"]``); a submitted run continues
  its caller's trace when ``submit`` had one (``trace_parent``, kept in
  ``metadata["lattice_caller"]["trace_carrier"]``). The root's carrier is
  queued with the segment's other writes (``RunStore.set_trace_carrier_call``:
  no round trip of its own; only the lease holder writes it, and the first
  one stays).
* Every lead segment's query runs with ``TraceContext(session_id=<run id>,
  parent_run_id=<run id>, remote_parent=<carrier>)``: a child of the root,
  in this process or in another.
* The lead copies the carrier into each member task message
  (``metadata["trace_carrier"]``, see
  :class:`~lattice_worker.runtime.lead.dispatch.RunLinkingMailbox`); the
  delivery runs the member under the root from it, without reading Redis.
* OpenTelemetry and Langfuse spans end in the process that started them, so
  the root ends with the first segment: with the run's result when the run
  ends in that segment, else with subtype ``"suspended"``. Later segments and
  the member runs are children of that ended span, in the same trace (as
  Temporal's tracing interceptors do with a workflow's spans).

A run whose first traced segment died before its first write has no carrier
stored: the segment that recovers it opens a new root (a second trace).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from lattice_client.caller_trace import CALLER_KEY
from lattice_client.models import RunRecord
from lattice_mailbox.message import TeamMessage

from ...team.team import Team
from ...tracing.base import ContextTracer, TraceContext, TraceEmitter, trace_carrier
from .context import WorkerContext

logger = logging.getLogger("lattice_worker.runtime")

TRACE_CARRIER_KEY = "trace_carrier"
"""The task-message metadata key (and ``lattice_parent`` key of a child run's
metadata) holding the carrier of the run's trace root."""

FLUSH_TIMEOUT_SECONDS = 10.0
"""How long (seconds) :func:`flush_tracers` waits for each tracer's ``flush()``."""

_END_WORDS = {"completed": "success"}
_ERROR_OUTCOMES = ("failed", "lost", "cancelled")


def run_tracer(team: Team) -> ContextTracer | None:
    """The tracer of ``team``'s distributed runs: the team's ``tracer``, else
    its lead spec's ``tracer`` option, else ``None`` (untraced)."""
    tracer = team.tracer
    if tracer is None and team.lead_spec is not None:
        tracer = team.lead_spec.options.tracer
    return tracer


def _carrier(value: Any) -> dict[str, str] | None:
    if not isinstance(value, dict):
        return None
    return {str(k): str(v) for k, v in value.items()}


class RunTrace:
    """The trace of one run as one lead segment sees it (built by :meth:`begin`).

    ``carrier``: the root's propagation headers (``{}`` when the tracer
    propagates none); ``final``: the lead's last ``result`` event of the
    segment (``drive`` sets it); ``outcome``: the segment's outcome word (the
    caller sets it). ``async with`` it around the segment's ``drive``: on exit
    the root ends (:meth:`end_segment`; with the exception as its error when
    one is raised).
    """

    def __init__(
        self, tracer: ContextTracer, run_id: str, carrier: dict[str, str], root: TraceEmitter | None
    ) -> None:
        self.tracer = tracer
        self.run_id = run_id
        self.carrier = carrier
        self.root = root
        self.final: Any = None
        self.outcome = "failed"

    async def __aenter__(self) -> RunTrace:
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        await self.end_segment(self.outcome, f"{type(exc).__name__}: {exc}" if exc is not None else None)

    @classmethod
    async def begin(cls, ctx: WorkerContext, team: Team, record: RunRecord, token: str) -> RunTrace | None:
        """The trace of the segment holding lease ``token`` on ``record``'s run,
        or ``None`` when the team has no tracer. Opens the team root when the
        record has no carrier yet and queues the carrier's write on
        ``ctx.writer`` (see the module doc); never raises for a tracer failure."""
        tracer = run_tracer(team)
        if tracer is None:
            return None
        run_id = record.run_id
        carrier = _carrier(record.trace_carrier)
        if carrier is not None:
            return cls(tracer, run_id, carrier, None)
        parent = record.parent.run_id if record.parent is not None and record.parent.run_id else None
        remote = None
        # a child run continues its parent run's trace; a submitted run its caller's (submit's trace_parent)
        for key in ("lattice_parent", CALLER_KEY):
            upstream = record.metadata.get(key)
            remote = remote or (
                _carrier(upstream.get(TRACE_CARRIER_KEY)) if isinstance(upstream, dict) else None
            )
        root = TraceEmitter(
            tracer,
            TraceContext(
                session_id=run_id,
                source={"kind": "team", "name": team.name},
                parent_run_id=parent,
                run_id=run_id,
                remote_parent=remote or None,
            ),
        )
        lead = team.lead_spec.options.name if team.lead_spec is not None else None
        await root.emit(
            "run_start",
            {"team": team.name, "lead": lead, "members": [m.name for m in team.members], "run_id": run_id},
        )
        carrier = trace_carrier(tracer, run_id)
        command, source = ctx.runs.set_trace_carrier_call(run_id, token, carrier)
        # observational: a refused or failed write is logged by the writer, never raised
        ctx.writer.queue_write([command], scripts=(source,))
        return cls(tracer, run_id, carrier, root)

    def lead_options(self, team: Team, agent: Any) -> dict[str, Any]:
        """The lead query's ``tracer`` and ``trace_context`` options: a
        ``team_lead`` run under the root."""
        return {
            "tracer": self.tracer,
            "trace_context": TraceContext(
                session_id=self.run_id,
                source={
                    "kind": "team_lead",
                    "name": getattr(agent, "name", None) or "lead",
                    "team": team.name,
                },
                agent_session_id=getattr(agent, "session_id", None),
                parent_run_id=self.run_id,
                remote_parent=self.carrier or None,
            ),
        }

    async def end_segment(self, outcome: str, error: str | None = None) -> None:
        """End the root when this segment opened it: with the lead's final
        result (``final``) when the run ``"completed"`` or ``"failed"`` here,
        else with subtype ``outcome`` (``"suspended"``, ``"lost"``...;
        an error for ``failed`` / ``lost`` / ``cancelled``)."""
        root, self.root = self.root, None
        if root is None:
            return
        final = self.final
        if final is not None and outcome in ("completed", "failed") and error is None:
            data = final.model_dump()
            keep = ("subtype", "is_error", "result", "structured_result", "usage", "num_turns", "error")
            summary = {k: data.get(k) for k in keep}
        else:
            is_error = outcome in _ERROR_OUTCOMES or error is not None
            summary = {"subtype": _END_WORDS.get(outcome, outcome), "is_error": is_error, "result": ""}
            if error is not None:
                summary["error"] = error
        await root.emit("result", summary)


def member_trace(
    team: Team, run_id: str | None, message: TeamMessage
) -> tuple[ContextTracer | None, TraceContext | None]:
    """``(tracer, trace_context)`` for ``run_work_item`` on ``message`` of run
    ``run_id``: the team's ``tracer`` (``None``: the member agent's own
    tracer applies) and the run's root as the trace context, from the
    carrier the lead put in the message; ``(None, None)`` when the run is
    not traced (no carrier in the message)."""
    carrier = _carrier(message.metadata.get(TRACE_CARRIER_KEY))
    if carrier is None or not run_id:
        return None, None
    root = TraceContext(
        session_id=run_id,
        source={"kind": "team", "name": team.name},
        run_id=run_id,
        remote_parent=carrier or None,
    )
    return team.tracer, root


def registry_tracers(teams: list[Team]) -> list[ContextTracer]:
    """Every distinct tracer of ``teams``: the teams', their leads' and their members' agents'."""
    found: dict[int, ContextTracer] = {}
    for team in teams:
        candidates = [team.tracer, run_tracer(team)]
        for member in team.members:
            options = getattr(member.agent, "options", None)
            candidates.append(getattr(options, "tracer", None))
        for tracer in candidates:
            if tracer is not None:
                found.setdefault(id(tracer), tracer)
    return list(found.values())


async def flush_tracers(teams: list[Team]) -> None:
    """``flush()`` every tracer of ``teams`` (each bounded by
    :data:`FLUSH_TIMEOUT_SECONDS`; failures are logged): a worker process
    calls it when it shuts down, so spans its exporters still buffer are sent."""
    for tracer in registry_tracers(teams):
        flush = getattr(tracer, "flush", None)
        if not callable(flush):
            continue
        try:
            result = flush()
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                await asyncio.wait_for(result, FLUSH_TIMEOUT_SECONDS)
        except Exception:
            logger.warning("tracer %r failed to flush at shutdown", tracer, exc_info=True)


__all__ = [
    "FLUSH_TIMEOUT_SECONDS",
    "TRACE_CARRIER_KEY",
    "RunTrace",
    "flush_tracers",
    "member_trace",
    "registry_tracers",
    "run_tracer",
]
