"""The model-call gate: a runtime's hook around each model call of a query (docs/contracts.md).

A runtime sets :data:`current_call_gate` (a ``ContextVar``) around a query;
the loop then awaits ``ticket = gate.before_call(request)`` before each model
request (``request``: the ``ModelRequest`` about to be sent; ``ticket``:
anything, handed back) and ``gate.after_call(usage, ticket)`` after it, in a
``finally`` -- also when the call failed or was abandoned (``usage``: the
reply's ``TokenUsage`` / dict, ``None`` without a reply). ``before_call`` may raise
:class:`~lattice_worker.agent.suspend.SuspendQuery`: no request is sent and the
query ends with subtype ``"suspended"``, its history intact (it ends with the
user message the request would have answered: continue with
``Agent.query(None)``). The distributed runtime's token budgets use it
(:mod:`lattice_worker.runtime.run.budget`). Nested queries started inside the
query (an agent tool) see the same gate.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Protocol


class CallGate(Protocol):
    """What the loop calls around each model call (see the module doc)."""

    async def before_call(self, request: Any) -> Any: ...

    async def after_call(self, usage: Any, ticket: Any) -> None: ...


current_call_gate: ContextVar[CallGate | None] = ContextVar("lattice_call_gate", default=None)
"""The gate of the queries running in this context (``None``: none)."""


__all__ = ["CallGate", "current_call_gate"]
