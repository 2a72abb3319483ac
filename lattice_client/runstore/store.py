"""The run store: :class:`RunStore`, every part of it in one class."""

from __future__ import annotations

from .budgets import RunBudgets
from .events import RunEvents
from .items import RunItems
from .journal import RunJournal
from .segments import RunSegments
from .tool_calls import RunToolCalls


class RunStore(RunSegments, RunItems, RunJournal, RunEvents, RunToolCalls, RunBudgets):
    """Runs, their work items and their event streams in Redis.

    ``redis_url_or_client``: a ``redis://`` URL (a client is then created per
    running event loop) or a ``redis.asyncio.Redis``. ``prefix``: the key prefix
    (``[A-Za-z0-9_.-]+``). ``max_events``: approximate bound of each run's
    event stream. Raises ``ValueError`` on a bad prefix.

    Redis failures surface as ``redis.exceptions.ConnectionError`` /
    ``TimeoutError``; every write is one atomic script, so a failed call either
    happened completely or not at all. See the package doc
    (:mod:`lattice_client.runstore`) for the keys.
    """


__all__ = ["RunStore"]
