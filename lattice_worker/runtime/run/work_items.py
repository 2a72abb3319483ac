"""Which run waits for a work item: the links the lead writes before a task
message exists, and the outcomes members leave for items not registered yet."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .keys import RUN_KEY_TTL_SECONDS, WorkerKeys
from .writer import Command

logger = logging.getLogger("lattice_worker.runtime")


class WorkItemLinks:
    """Work-item links and early outcomes (keys ``P:workitem:*``, see
    :mod:`lattice_worker.runtime.run.keys`). ``redis``: returns the running loop's
    ``redis.asyncio`` client (``decode_responses=True``; the run store's)."""

    def __init__(self, keys: WorkerKeys, redis: Callable[[], Awaitable[Any]]) -> None:
        self.keys = keys
        self._redis = redis

    def link_command(self, run_id: str, team: str, work_item_id: str) -> Command:
        """The command linking ``work_item_id`` to run ``run_id`` of ``team``, for
        :meth:`~lattice_worker.runtime.run.writer.RunWriter.write`."""
        value = json.dumps({"run_id": run_id, "team": team})
        return ("set", self.keys.work_item(work_item_id), value, RUN_KEY_TTL_SECONDS)

    async def link(self, run_id: str, team: str, work_item_ids: list[str]) -> None:
        """Remember which run waits for each work item (read by ``deliver`` and the reaper)."""
        if not work_item_ids:
            return
        client = await self._redis()
        async with client.pipeline(transaction=False) as pipe:
            for wid in work_item_ids:
                name, *args = self.link_command(run_id, team, wid)
                getattr(pipe, name)(*args)
            await pipe.execute()

    async def run_of(self, work_item_id: str | None) -> tuple[str, str] | None:
        """``(run_id, team)`` waiting for ``work_item_id``, or ``None`` (a message
        that is no run's work item, e.g. a ``team_send`` between members)."""
        if not work_item_id:
            return None
        client = await self._redis()
        raw = await client.get(self.keys.work_item(work_item_id))
        if not raw:
            return None
        try:
            data = json.loads(raw)
            return str(data["run_id"]), str(data["team"])
        except (ValueError, KeyError, TypeError):
            logger.warning("malformed work item link %s: %r", work_item_id, raw)
            return None

    async def save_early_outcome(self, work_item_id: str, outcome: dict[str, Any]) -> None:
        """Keep the outcome of an item its run has not registered yet (the lead
        reads it right after registering, see ``lead.dispatch.dispatch_items``)."""
        client = await self._redis()
        await client.set(self.keys.early_outcome(work_item_id), json.dumps(outcome), ex=RUN_KEY_TTL_SECONDS)

    async def early_outcomes(self, work_item_ids: list[str]) -> list[Any]:
        """The raw early outcomes (JSON text or ``None``) of ``work_item_ids``, in
        order: one pipeline of ``GET`` (their keys lie in many slots of a Redis Cluster)."""
        client = await self._redis()
        async with client.pipeline(transaction=False) as pipe:
            for wid in work_item_ids:
                pipe.get(self.keys.early_outcome(wid))
            return list(await pipe.execute())


__all__ = ["WorkItemLinks"]
