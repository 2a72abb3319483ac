"""The tool journal of a lead segment's own tool calls, fenced by its lead lease.

The base class and the journal's rules are in
:mod:`lattice_worker.runtime.run.journal` (docs/tool-effects.md).
"""

from __future__ import annotations

from typing import Any

from lattice_client.errors import RunLeaseLostError

from ..run.journal import Journal
from .lease import LeadLease


class LeadJournal(Journal):
    """The tool journal of the lead's own tools in one segment, fenced by the
    segment's lead lease. A recovering segment (``lease.recover``) reads the
    journal once, on first use."""

    def __init__(self, ctx: Any, run_id: str, team: str, lease: LeadLease) -> None:
        super().__init__(ctx, run_id, team, "lead", run_id)
        self.lease = lease
        self._loaded = not lease.recover

    async def _load(self) -> None:
        if not self._loaded:
            self.records = await self.runs.lead_tool_journal(self.run_id)
            self._loaded = True

    def _failed(self, operation: str) -> Any:
        def mapped(exc: BaseException) -> BaseException:
            error = self.runs.script_error(exc, self.run_id, operation)
            if isinstance(error, RunLeaseLostError):
                self.lease.mark_lost()
            return error

        return mapped

    async def _set(self, fields: dict[str, Any], *, durable: bool) -> None:
        command, source = self.runs.journal_tool_call(self.run_id, self.lease.token, fields)
        if durable:
            await self.writer.write([command], scripts=(source,), on_error=self._failed("journal_tool"))
        else:
            self.writer.queue_write(
                [command], scripts=(source,), fence=self.lease.token, on_error=self._failed("journal_tool")
            )

    def _wait_id(self, tool_use_id: str, kind: str) -> str:
        return f"{self.run_id}/{tool_use_id}"

    async def _store_wait(self, wait_id: str, wait: dict[str, Any]) -> None:
        command, source = self.runs.park_lead_call(self.run_id, self.lease.token, wait_id, wait)
        await self.writer.write(
            [command, self.runs.index_wait_command(self.run_id), ("zrem", self.runs.leases_key, self.run_id)],
            scripts=(source,),
            on_error=self._failed("park_lead"),
        )
        self.lease.end()  # the run is suspended on the wait: renewals stop quietly


__all__ = ["LeadJournal"]
