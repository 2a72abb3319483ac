"""Lead segments: their start under a lead lease, renewal, expiry and recovery."""

from __future__ import annotations

import os
from typing import Any

from redis.commands.core import AsyncScript

from ..models import RunResult, RunStatus
from .records import (
    LeadRecovery,
    SegmentStart,
    as_text,
    dumps,
    now_ms,
    pairs,
    parse_items,
    parse_record,
    to_lease_ms,
)
from .run_records import RunRecords


class RunSegments(RunRecords):
    """Lead segments and their leases (part of :class:`~lattice_client.runstore.RunStore`)."""

    async def begin_segment(
        self,
        run_id: str,
        *,
        expect: RunStatus | str,
        lease_s: float,
        token: str | None = None,
        read_record: bool = False,
        history_key: str | None = None,
        read_items: bool = False,
        usage_key: str | None = None,
    ) -> SegmentStart | None:
        """Start a lead segment: ``expect`` (``queued`` or ``resuming``) ->
        ``running`` under a new lead lease of ``lease_s`` **seconds**, exactly
        once (a duplicate or redelivered task gets ``None``, as does an unknown
        or cancelled run). The run enters the lease index first, so the reaper
        finds it even if this process dies right after. In the same round
        trip, ``read_record=True`` reads the run record (``SegmentStart.record``),
        ``history_key`` (a list key of the run, under its hash tag) the
        lead's history (``SegmentStart.history``), ``read_items=True`` the
        run's work items (``SegmentStart.items``) and ``usage_key`` (a hash key
        of the run) its integer fields (``SegmentStart.usage``). Raises
        ``ValueError`` for a non-positive ``lease_s``, an ``expect`` other than
        ``queued`` / ``resuming`` or a ``history_key`` / ``usage_key`` that is
        not the run's."""
        commands, _ = self.begin_segment_call(
            run_id,
            expect=expect,
            lease_s=lease_s,
            token=token,
            read_record=read_record,
            history_key=history_key,
            read_items=read_items,
            usage_key=usage_key,
        )

        def build(pipe: Any, scripts: dict[str, AsyncScript]) -> None:
            for name, *args in commands:
                if name == "evalsha":
                    args[0] = scripts["begin_segment"].sha
                getattr(pipe, name)(*args)

        return self.begin_segment_reply(commands, await self._pipeline(build))

    def begin_segment_call(
        self,
        run_id: str,
        *,
        expect: RunStatus | str,
        lease_s: float,
        token: str | None = None,
        read_record: bool = False,
        history_key: str | None = None,
        read_items: bool = False,
        usage_key: str | None = None,
    ) -> tuple[list[tuple[Any, ...]], str]:
        """:meth:`begin_segment` as ``(commands, source)`` for the caller's own
        pipeline (see :meth:`journal_call_call`): the lease index entry (``ZADD``,
        idempotent: it may be sent twice) and the script call, in that order.
        Read their replies with :meth:`begin_segment_reply`. Raises
        ``ValueError`` like :meth:`begin_segment`."""
        expected = RunStatus.parse(expect)
        if expected not in (RunStatus.QUEUED, RunStatus.RESUMING):
            raise ValueError(f"begin_segment expects 'queued' or 'resuming', got {expected.value!r}")
        lease_ms = to_lease_ms(lease_s)
        token = token or os.urandom(16).hex()  # as uuid4().hex: 32 random hex digits
        k = self.keys(run_id)
        for key in (history_key, usage_key):
            if key is not None and not key.startswith(k.record + ":"):
                raise ValueError(f"history/usage key {key!r} is not a key of run {run_id!r}")
        now = now_ms()
        until = now + lease_ms
        reads = ("r" if read_record else "") + ("h" if history_key is not None else "")
        reads += ("i" if read_items else "") + ("u" if usage_key is not None else "")
        keys = [k.record]
        if reads:  # the reads happen in the script, right after the start (one reply)
            keys += [history_key or k.record, k.order, k.items, k.state, k.outcomes, usage_key or k.record]
        call, source = self._call("begin_segment", keys, [expected.value, token, until, now, reads])
        # ZADD ... GT (positional: nx, xx, ch, incr, gt), for pipelines built from (method, *args)
        index = ("zadd", self.leases_key, {run_id: until}, False, False, False, False, True)
        return [index, call], source

    @staticmethod
    def begin_segment_reply(commands: list[tuple[Any, ...]], replies: list[Any]) -> SegmentStart | None:
        """The :class:`SegmentStart` (or ``None``: refused) from the replies of
        the :meth:`begin_segment_call` ``commands``."""
        call = commands[-1]
        numkeys = call[2]
        token, until, reads = call[3 + numkeys + 1], call[3 + numkeys + 2], call[3 + numkeys + 4]
        out = replies[-1]
        if not int(out[0]):
            return None
        record = history = items = usage = None
        if "r" in reads:
            raw = pairs(out[3])
            record = parse_record(raw) if raw else None
        if "h" in reads:
            history = [as_text(x) for x in out[4]]
        if "i" in reads:
            items = parse_items(out[5], pairs(out[6]), pairs(out[7]), pairs(out[8]))
        if "u" in reads:
            usage = {}
            for name, value in pairs(out[9]).items():
                try:
                    usage[name] = int(value)
                except ValueError:
                    continue
        return SegmentStart(
            token=token,
            lease_until=until,
            attempts=int(out[1]),
            recover=as_text(out[2]) == "1",
            record=record,
            history=history,
            items=items,
            usage=usage,
        )

    @staticmethod
    def begin_segment_refusal(replies: list[Any]) -> str | None:
        """The status a refused :meth:`begin_segment_call` found the run in
        (``"running"``, ``"suspended"``, ...), read from the same replies at
        the moment of the refusal; ``None`` when the run is missing (or the
        start was not refused)."""
        out = replies[-1]
        if int(out[0]) or len(out) < 2:
            return None
        return as_text(out[1]) or None

    async def set_trace_carrier(self, run_id: str, token: str, carrier: dict[str, str]) -> bool:
        """Keep ``carrier`` (the propagation headers of the run's trace root, a
        ``dict[str, str]``; ``{}`` when the tracers propagate none) in the run
        record as ``trace_carrier``, while ``token`` holds the run. The first
        one stays: returns False (nothing written) when the record already has
        one. Raises :class:`RunLeaseLostError` when ``token`` does not hold the
        run, ``ValueError`` when ``carrier`` is not a dict of strings."""
        (_, _, _, *keys_args), _ = self.set_trace_carrier_call(run_id, token, carrier)
        return bool(await self._run("set_trace_carrier", run_id, keys_args[:1], keys_args[1:]))

    def set_trace_carrier_call(
        self, run_id: str, token: str, carrier: dict[str, str]
    ) -> tuple[tuple[Any, ...], str]:
        """:meth:`set_trace_carrier` as ``(command, source)`` for the caller's own
        pipeline (see :meth:`journal_call_call`); its reply is 1 (written) or 0.
        Raises ``ValueError`` like :meth:`set_trace_carrier`."""
        if not isinstance(carrier, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in carrier.items()
        ):
            raise ValueError(f"a trace carrier must be a dict of strings, got {carrier!r:.200}")
        return self._call(
            "set_trace_carrier", [self.keys(run_id).record], [token, dumps(carrier, "trace carrier")]
        )

    async def extend_lead_lease(self, run_id: str, token: str, lease_s: float) -> bool:
        """Renew a running segment's lease to ``lease_s`` **seconds** from now.
        False when ``token`` no longer holds the run (taken over, cancelled,
        finished): the segment must stop."""
        lease_ms = to_lease_ms(lease_s)
        until = now_ms() + lease_ms
        k = self.keys(run_id)
        ok = bool(await self._run("extend_lead_lease", run_id, [k.record], [token, until]))
        if ok:
            await self._conn().client.zadd(self.leases_key, {run_id: until}, gt=True)
        return ok

    async def expired_leads(self, *, now: int | None = None, limit: int = 100) -> list[str]:
        """Run ids in the lease index whose ``lease_until`` is at or before
        ``now`` (ms; default the current time), oldest first, at most ``limit``.
        Candidates only: :meth:`recover_lead` checks each record."""
        now = now_ms() if now is None else now
        raw = await self._conn().client.zrangebyscore(self.leases_key, "-inf", now, start=0, num=limit)
        return [as_text(x) for x in raw]

    async def recover_lead(self, run_id: str, *, max_attempts: int, now: int | None = None) -> LeadRecovery:
        """Take over run ``run_id`` when it is ``running`` and its lead lease
        expired at or before ``now`` (ms; default the current time): below
        ``max_attempts`` segment starts it becomes ``resuming`` with the recover
        flag (the caller sends ``lattice.resume_lead``); at ``max_attempts`` it
        fails with an error naming the attempts (the caller replies upstream
        for a child run). Either way the old token stops holding the run. Keeps
        the lease index in step (drops runs that are not running, re-scores
        live ones). See :class:`LeadRecovery`."""
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        now = now_ms() if now is None else now
        k = self.keys(run_id)
        client = self._conn().client
        status, token, until, attempts = [
            as_text(x) if x is not None else None
            for x in await client.hmget(k.record, ["status", "lease_token", "lease_until", "lead_attempts"])
        ]
        tries = int(attempts or 0)
        if status != RunStatus.RUNNING.value:
            await client.zrem(self.leases_key, run_id)
            return LeadRecovery("gone", tries)
        lease_until = int(until or 0)
        if lease_until > now:
            await client.zadd(self.leases_key, {run_id: lease_until}, xx=True)
            return LeadRecovery("alive", tries, lease_until=lease_until)
        fail = tries >= max_attempts
        result = RunResult(
            run_id=run_id,
            status="failed",
            error=(
                f"the lead of run {run_id} was started {tries} time(s) and each time its lease expired "
                f"before the segment ended (the worker died or stalled); max_attempts is {max_attempts}"
            ),
        )
        out = int(
            await self._run(
                "recover_lead",
                run_id,
                [k.record, k.events, self.result_key(run_id)],
                [
                    token or "",
                    now,
                    "fail" if fail else "requeue",
                    result.model_dump_json(),
                    dumps(result.to_event(), "result"),
                    self.max_events,
                ],
            )
        )
        if out == 0:  # renewed, taken or finished in between: look again next sweep
            return LeadRecovery("gone" if await self.get(run_id) is None else "alive", tries)
        await client.zrem(self.leases_key, run_id)
        record = await self.get(run_id)
        if out == 2:
            return LeadRecovery("failed", tries, result=result, record=record)
        return LeadRecovery("requeued", tries, record=record)


__all__ = ["RunSegments"]
