"""Lead leases: a worker running a lead segment holds its run, and only it may write.

docs/architecture.md, "Crash" (the lease model of member claims, applied to
lead turns). A *segment* is one stretch of a run's
lead loop in one worker: from ``run_lead`` (or ``resume_lead``) to the
suspension or the end. :meth:`~lattice_client.runstore.RunStore.begin_segment`
gives it a lease token and ``lease_until``; :class:`LeadLease` renews it every
``lease_s / 3`` seconds while the segment runs. If the worker dies, the
reaper finds the expired lease and re-enqueues the run for a *recovering*
resume (``lattice_worker.runtime.lead.recovery.recover_segment``), or fails it past
``max_attempts``.

Fencing: every write of a segment carries its token and is refused once the
token no longer holds the run (``RunLeaseLostError``): history writes go
through :class:`FencedHistoryStore`, the member calls of a tool batch are
journaled under the token before their task messages are sent, and work
items, suspension and the final result are written with it. When a renewal
is refused, the segment's abort signal fires, so a stale worker that comes
back stops at its next step instead of writing over its successor.

:class:`~lattice_worker.runtime.run.replay.ReplayModelClient` lets a recovering segment finish the assistant turn
the dead worker had started: the persisted assistant message is "returned by
the model" once, so the loop runs that tool batch again through the normal
path (hooks, events, ``after_tool_batch``), and member calls already sent are
found in the journal instead of being sent twice.
"""

from __future__ import annotations

import logging
from typing import Any

from lattice_client.errors import RunLeaseLostError
from lattice_client.runstore import RunStore, SegmentStart

from ...agent.abort import AbortController
from ...agent.history_stores import RedisHistoryStore
from ..run.renewal import RenewalLoop
from ..run.replay import encode_message

logger = logging.getLogger("lattice_worker.runtime.run.renewal")


class LeadLease(RenewalLoop):
    """The lease of one lead segment, renewed until the ``async with`` block ends.

    Args:
        runs: the run store.
        run_id: the run.
        start: what ``RunStore.begin_segment`` returned (token, attempts, recover flag).
        lease_s: lease length in **seconds**; renewed every ``lease_s / 3``.

    :attr:`controller` is aborted (reason: a :class:`RunLeaseLostError`) when a
    renewal is refused; :attr:`lost` is then True. A transient store failure is
    logged and retried on the next tick (if the lease expires meanwhile, the
    next renewal reports the loss).
    """

    def __init__(self, runs: RunStore, run_id: str, start: SegmentStart, lease_s: float) -> None:
        super().__init__(lease_s, f"lead-lease:{run_id}")
        self.runs = runs
        self.run_id = run_id
        self.token = start.token
        self.attempts = start.attempts
        self.recover = start.recover
        self.controller = AbortController()
        self.lost = False
        self.ended = False

    def end(self) -> None:
        """The segment ended (suspended): later renewals stop without reporting a loss."""
        self.ended = True

    def mark_lost(self) -> None:
        """Record the loss (a write was refused) and abort the segment's signal."""
        if not self.lost:
            self.lost = True
            self.controller.abort(RunLeaseLostError(self.run_id, "continue"))

    async def renew_once(self) -> bool:
        """One renewal; False (and the signal aborted) when the lease is lost."""
        if self.ended:
            return False
        try:
            ok = await self.runs.extend_lead_lease(self.run_id, self.token, self.lease_s)
        except Exception:  # transient: retry next tick
            logger.warning("lead lease renewal of run %s failed; retrying", self.run_id, exc_info=True)
            return True
        if not ok:
            logger.warning(
                "run %s: lead lease lost (taken over, cancelled or finished); stopping", self.run_id
            )
            self.mark_lost()
            return False
        self.renewals += 1
        return True


class FencedHistoryStore(RedisHistoryStore):
    """A run's lead history (the Redis list ``key``) written only under the
    segment's lease: ``append`` and ``replace`` are one Lua script each that
    checks the token (``RunStore.write_history``) and raise
    :class:`RunLeaseLostError` -- aborting the segment -- when it no longer
    holds the run. ``load`` is the plain list read, or -- once -- the
    elements given as ``history`` (read when the segment started). ``ttl_seconds``:
    expiry (seconds) renewed on every write.

    With a ``writer`` (the worker's :class:`~lattice_worker.runtime.run.writer.RunWriter`)
    the writes are queued on it, in order with the run's events,
    and go with the segment's next write -- a member call's journal entry
    (so a tool batch's assistant turn is stored before any member work is
    sent), the registration, the suspension, the finish -- or at the latest
    after the writer's linger (``EVENT_LINGER_SECONDS``). A worker dying
    within that window loses the turn: the recovering segment asks the model
    again instead of replaying it. Those steps raise a failure of the queued
    writes (``writer.sync(lease.token)``); ``load`` writes them first.
    A write made while the previous one is still queued (only events and
    other queued commands after it, see ``writer.still_queued``) is merged
    into it: one script call stores both, in order, under the same token."""

    def __init__(
        self,
        lease: LeadLease,
        client: Any,
        key: str,
        *,
        ttl_seconds: float | None = None,
        history: list[str] | None = None,
        writer: Any = None,
    ) -> None:
        super().__init__(client, key, fail_on_error=True, ttl_seconds=ttl_seconds)
        self.lease = lease
        self.writer = writer
        self._preloaded = history
        self._queued: Any = None  # the last write queued on the writer
        self._queued_values: list[bytes] = []
        self._queued_replace = False

    async def load(self) -> list[dict[str, Any]]:
        """The stored messages (see :meth:`RedisHistoryStore.load`)."""
        preloaded, self._preloaded = self._preloaded, None
        if preloaded is not None:
            return self._decode_list(preloaded)
        if self.writer is not None:
            await self.writer.sync(self.lease.token)  # what this segment queued is part of it
        return await super().load()

    async def _write(self, values: list[bytes], *, replace: bool) -> None:
        lease = self.lease
        if self.writer is None:
            try:
                await lease.runs.write_history(
                    lease.run_id, lease.token, self.key, values, replace=replace, ttl_ms=self._ttl_ms()
                )
            except RunLeaseLostError:
                lease.mark_lost()
                raise
            return
        if not replace and self._queued is not None and self.writer.still_queued(self._queued):
            # the previous write is still waiting: one script call writes both
            # (the same messages in the same order, under the same token)
            values = self._queued_values + values
            replace = self._queued_replace
            command, _ = lease.runs.write_history_call(
                lease.run_id, lease.token, self.key, values, replace=replace, ttl_ms=self._ttl_ms()
            )
            self._queued.commands[0] = command
            self._queued_values = values
            return
        command, source = lease.runs.write_history_call(
            lease.run_id, lease.token, self.key, values, replace=replace, ttl_ms=self._ttl_ms()
        )
        self._queued = self.writer.queue_write(
            [command], scripts=(source,), fence=lease.token, on_error=self._failed
        )
        self._queued_values = values
        self._queued_replace = replace

    def _failed(self, exc: BaseException) -> BaseException:
        mapped = self.lease.runs.script_error(exc, self.lease.run_id, "write_history")
        if isinstance(mapped, RunLeaseLostError):
            self.lease.mark_lost()
        return mapped

    async def append(self, message: dict[str, Any]) -> None:
        """Append one message (``TypeError`` for a non-dict / non-JSON message)."""
        await self._write([encode_message(message, "FencedHistoryStore.append")], replace=False)

    async def replace(self, messages: list[dict[str, Any]]) -> None:
        """Make the list hold exactly ``messages`` (all encoded first: a bad one
        raises ``TypeError`` and nothing is written)."""
        if not isinstance(messages, list):
            raise TypeError(f"FencedHistoryStore.replace: expected a list, got {type(messages).__name__}")
        await self._write([encode_message(m, "FencedHistoryStore.replace") for m in messages], replace=True)


__all__ = ["FencedHistoryStore", "LeadLease"]
