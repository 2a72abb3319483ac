"""A run's token usage, summed over its lead segments (hash ``P:run:{run:<id>}:usage``)."""

from __future__ import annotations

from typing import Any

from .keys import RUN_KEY_TTL_SECONDS, WorkerKeys
from .writer import Command, RunWriter


class UsageCounter:
    """Adds lead segments' token usage to their run's total, through ``writer``."""

    def __init__(self, keys: WorkerKeys, writer: RunWriter) -> None:
        self.keys = keys
        self.writer = writer

    async def add(
        self,
        run_id: str,
        usage: dict[str, Any] | None,
        *,
        total: bool = False,
        known: dict[str, int] | None = None,
        fence: str | None = None,
    ) -> dict[str, int]:
        """Add one lead segment's token usage to the run's total (nothing is
        written for an all-zero usage). With ``total=True`` returns the run's
        total so far (every key of ``usage`` present, zeros included), else ``{}``.
        Written in the same pipeline as the queued events (which it flushes).
        Raises the Redis error when the write fails.

        ``known``: the run's totals as this segment knows them (read when it
        started -- a lead segment holds its run alone -- and kept up to date
        here, in place). The increments are then queued under ``fence`` (see
        :meth:`RunWriter.queue_write`) and the total needs no read."""
        counts = {
            str(k): v for k, v in (usage or {}).items() if isinstance(v, int) and not isinstance(v, bool)
        }
        nonzero = {k: v for k, v in counts.items() if v}
        if not nonzero and not total:
            return {}
        key = self.keys.usage(run_id)
        commands: list[Command] = [("hincrby", key, name, value) for name, value in nonzero.items()]
        if nonzero:
            commands.append(("expire", key, RUN_KEY_TTL_SECONDS))
        if known is not None:
            if commands:
                self.writer.queue_write(commands, fence=fence)
            for name, value in nonzero.items():
                known[name] = known.get(name, 0) + value
            return {**{name: 0 for name in counts}, **known} if total else {}
        if total:
            commands.append(("hgetall", key))
        out = await self.writer.write(commands)
        if not total:
            return {}
        summed = {name: 0 for name in counts}
        summed.update({_text(k): int(v) for k, v in (out[-1] or {}).items()})
        return summed


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


__all__ = ["UsageCounter"]
