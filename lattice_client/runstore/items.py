"""Work items: registration in a run's wait set, completion, suspension, clearing."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from redis.exceptions import ResponseError

from ..errors import RunStateError
from .core import RunStoreCore
from .records import CompleteResult, WorkItem, as_text, dumps, now_ms, parse_items


class RunItems(RunStoreCore):
    """Work items and the wait set (part of :class:`~lattice_client.runstore.RunStore`)."""

    async def add_items(
        self, run_id: str, items: list[dict[str, Any]], *, max_active: int, token: str | None = None
    ) -> list[dict[str, Any]]:
        """Register ``items`` (in order) in the run's wait set; return those that
        may be dispatched now.

        At most ``max_active`` (integer >= 1; the run's
        ``max_concurrent_work_items``) of the run's items are dispatched and
        unfinished at any time; the others wait in registration order and are
        handed out by :meth:`complete_item`. An item id already registered is
        skipped. On a finished or cancelled run items are recorded but none is
        dispatched. Registering empties the run's call journal (see
        :meth:`journal_call`). ``token``: the calling lead segment's lease token;
        when given, a run that is not finished must be running under it, else
        :class:`RunLeaseLostError` and nothing is written. Raises
        :class:`RunNotFoundError` for an unknown run and ``ValueError`` for a bad
        ``max_active``, a malformed item (see :class:`WorkItem`) or a duplicated
        id within ``items``.
        """
        (_, _, numkeys, *keys_args), _ = self.add_items_call(
            run_id, items, max_active=max_active, token=token
        )
        out = await self._run("add_items", run_id, keys_args[:numkeys], keys_args[numkeys:])
        return self.add_items_reply(out)

    def add_items_call(
        self, run_id: str, items: list[dict[str, Any]], *, max_active: int, token: str | None = None
    ) -> tuple[tuple[Any, ...], str]:
        """:meth:`add_items` as ``(command, source)`` for the caller's own
        pipeline (see :meth:`journal_call_call`); read its reply with
        :meth:`add_items_reply`. Raises ``ValueError`` like :meth:`add_items`."""
        if isinstance(max_active, bool) or not isinstance(max_active, int) or max_active < 1:
            raise ValueError(f"max_active must be an integer >= 1, got {max_active!r}")
        if not isinstance(items, list):
            raise ValueError(f"items must be a list of dicts, got {type(items).__name__}")
        args: list[Any] = [max_active, now_ms(), token or ""]
        seen: set[str] = set()
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                raise ValueError(f"work item #{index} must be a dict, got {type(item).__name__}")
            try:
                checked = WorkItem.model_validate(item)
            except ValidationError as exc:
                raise ValueError(f"invalid work item #{index}: {exc}") from None
            if checked.work_item_id in seen:
                raise ValueError(f"work item id {checked.work_item_id!r} appears twice")
            seen.add(checked.work_item_id)
            args += [checked.work_item_id, dumps(item, f"work item #{index}")]
        k = self.keys(run_id)
        return self._call(
            "add_items", [k.record, k.items, k.order, k.state, k.wait, k.queued, k.active, k.calls], args
        )

    @staticmethod
    def add_items_reply(reply: Any) -> list[dict[str, Any]]:
        """The items dispatched now, from an ``add_items`` reply."""
        return [json.loads(as_text(x)) for x in reply]

    async def complete_item(self, run_id: str, work_item_id: str, outcome: dict[str, Any]) -> CompleteResult:
        """Record the outcome of one work item; idempotent.

        Removes the item from the wait set, returns the queued items now allowed
        to dispatch and ``resume=True`` exactly once: when this completion
        emptied the wait set of a ``suspended`` run (which atomically becomes
        ``resuming``). A repeated completion, an unknown or cleared item returns
        ``CompleteResult(resume=False, dispatch=[], recorded=False)`` and changes
        nothing. On a finished or cancelled run the outcome is stored, but
        nothing is dispatched or resumed. Raises ``ValueError`` when ``outcome``
        is not a JSON-serialisable dict.
        """
        (_, _, numkeys, *keys_args), _ = self.complete_item_call(run_id, work_item_id, outcome)
        out = await self._run("complete_item", run_id, keys_args[:numkeys], keys_args[numkeys:])
        return self.complete_reply(out)

    def complete_item_call(
        self, run_id: str, work_item_id: str, outcome: dict[str, Any]
    ) -> tuple[tuple[Any, ...], str]:
        """:meth:`complete_item` as ``(command, source)`` for the caller's own
        pipeline (see :meth:`journal_call_call`); read its reply with
        :meth:`complete_reply`. Raises ``ValueError`` like :meth:`complete_item`."""
        if not isinstance(outcome, dict):
            raise ValueError(f"outcome must be a dict, got {type(outcome).__name__}")
        if not isinstance(work_item_id, str) or not work_item_id:
            raise ValueError(f"work_item_id must be a non-empty string, got {work_item_id!r}")
        k = self.keys(run_id)
        return self._call(
            "complete_item",
            [k.record, k.items, k.state, k.outcomes, k.wait, k.queued, k.active],
            [work_item_id, dumps(outcome, "outcome"), now_ms()],
        )

    @staticmethod
    def complete_reply(out: Any) -> CompleteResult:
        """The :class:`CompleteResult` of a ``complete_item`` reply."""
        return CompleteResult(
            resume=bool(int(out[1])),
            dispatch=[json.loads(as_text(x)) for x in out[3:]],
            recorded=bool(int(out[0])),
            run_status=as_text(out[2]) or None,
        )

    async def suspend(self, run_id: str, *, token: str | None = None, unindex_lease: bool = True) -> bool:
        """Suspend a ``running`` run until its wait set is empty.

        True: the run is now ``suspended`` (the caller's task ends; the last
        :meth:`complete_item` returns ``resume=True``). False: the wait set was
        already empty, nothing changed, the caller continues at once. Atomic
        with :meth:`complete_item`, so a wake-up is never lost or doubled.
        Raises :class:`RunNotFoundError` / :class:`RunStateError` (the run is
        neither running nor suspended, e.g. cancelled). ``token``: the calling
        lead segment's lease token; when given, an unfinished run must be
        running under it (else :class:`RunLeaseLostError`); a suspension ends
        the segment (its lease is removed from the record and -- unless
        ``unindex_lease=False``: the caller removes ``run_id`` from
        :attr:`leases_key` itself, e.g. in its next pipeline -- the lease index).
        """
        k = self.keys(run_id)
        try:
            suspended = bool(await self._run("suspend", run_id, [k.record, k.wait], [now_ms(), token or ""]))
        except ResponseError as exc:
            mapped = self.suspend_error(exc, run_id)
            if mapped is exc:
                raise
            raise mapped from None
        if suspended and token and unindex_lease:
            await self._unindex_lease(run_id)
        return suspended

    def suspend_call(self, run_id: str, *, token: str | None = None) -> tuple[tuple[Any, ...], str]:
        """:meth:`suspend` as ``(command, source)`` for the caller's own pipeline
        (see :meth:`journal_call_call`); its reply is 1 (suspended) or 0 (the
        wait set is empty). The lease index is the caller's (see :meth:`suspend`,
        ``unindex_lease=False``); map an error reply with :meth:`suspend_error`."""
        k = self.keys(run_id)
        return self._call("suspend", [k.record, k.wait], [now_ms(), token or ""])

    @classmethod
    def suspend_error(cls, exc: BaseException, run_id: str) -> BaseException:
        """:meth:`script_error` for a ``suspend`` error reply, plus
        :class:`RunStateError` for ``BADSTATE`` (the run is neither running nor suspended)."""
        message = str(exc) if isinstance(exc, ResponseError) else ""
        if message.startswith("BADSTATE"):
            return RunStateError(run_id, message.split(" ", 1)[1], "suspend")
        return cls.script_error(exc, run_id, "suspend")

    async def items(self, run_id: str) -> list[dict[str, Any]]:
        """The run's registered items in registration order, each with
        ``state`` (``queued|dispatched|done``) and ``outcome`` (dict or ``None``)."""
        k = self.keys(run_id)
        async with self._conn().client.pipeline(transaction=True) as pipe:
            pipe.lrange(k.order, 0, -1)
            pipe.hgetall(k.items)
            pipe.hgetall(k.state)
            pipe.hgetall(k.outcomes)
            order, items, states, outcomes = await pipe.execute()
        return parse_items(order, items, states, outcomes)

    async def clear_items(self, run_id: str, *, token: str | None = None) -> int:
        """Forget the run's finished items (after a resume consumed their
        outcomes); unfinished items stay. Returns how many were removed.
        ``token``: as for :meth:`suspend` (:class:`RunLeaseLostError` when it
        does not hold the run; nothing removed)."""
        (_, _, numkeys, *keys_args), _ = self.clear_items_call(run_id, token=token)
        return int(await self._run("clear_items", run_id, keys_args[:numkeys], keys_args[numkeys:]))

    def clear_items_call(self, run_id: str, *, token: str | None = None) -> tuple[tuple[Any, ...], str]:
        """:meth:`clear_items` as ``(command, source)`` for the caller's own
        pipeline (see :meth:`journal_call_call`); its reply is the count removed."""
        k = self.keys(run_id)
        return self._call("clear_items", [k.items, k.order, k.state, k.outcomes, k.record], [token or ""])

    async def unread_reports(self, run_id: str) -> list[str]:
        """Ids of the upstream messages (replies, failure reports) of the run's
        finished work items that its lead has not consumed yet, in registration
        order -- what must be closed when the run ends without reading them."""
        ids = []
        for item in await self.items(run_id):
            report = (item.get("outcome") or {}).get("report")
            if isinstance(report, dict) and report.get("id"):
                ids.append(str(report["id"]))
        return ids


__all__ = ["RunItems"]
