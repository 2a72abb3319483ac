"""Run events and results: the event stream, the result stream, finish and cancel."""

from __future__ import annotations

import json
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from lattice_mailbox.connections import read_again

from ..errors import RunLeaseLostError
from ..models import RunResult
from .core import RunStoreCore
from .records import (
    EventFence,
    as_text,
    check_block_ms,
    decode_event,
    dumps,
    final_from_reply,
    now_ms,
    result_from_reply,
    stream_entries,
)


class RunEvents(RunStoreCore):
    """Event streams and results (part of :class:`~lattice_client.runstore.RunStore`)."""

    async def append_event(self, run_id: str, event: dict[str, Any]) -> str:
        """Append ``event`` (a JSON-serialisable dict with a string ``type``) to
        the run's stream; returns the stream entry id. Raises
        :class:`RunNotFoundError` for an unknown run, ``ValueError`` on a bad event."""
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise ValueError("an event must be a dict with a string 'type'")
        k = self.keys(run_id)
        entry = await self._run(
            "append_event", run_id, [k.record, k.events], [self.max_events, dumps(event, "event")]
        )
        return as_text(entry)

    async def append_events(
        self, run_id: str, events: list[dict[str, Any]], *, fence: EventFence | None = None
    ) -> list[str]:
        """Append ``events`` (as for :meth:`append_event`), in order, with one
        script call; returns their stream entry ids. Nothing is appended when
        one is bad (``ValueError``) or the run is unknown (:class:`RunNotFoundError`).
        ``fence`` (of this run: else ``ValueError``): append only while it holds
        (see :meth:`append_events_call`), else :class:`RunLeaseLostError` and
        nothing is appended."""
        for event in events:
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise ValueError("an event must be a dict with a string 'type'")
        if fence is not None and fence.run_id != run_id:
            raise ValueError(f"the fence is run {fence.run_id!r}'s, not run {run_id!r}'s")
        if not events:
            return []
        (_, _, numkeys, *keys_args), _ = self.append_events_call(
            run_id, [dumps(e, "event") for e in events], fence
        )
        name = "append_events" if fence is None else "append_events_fenced"
        out = await self._run(name, run_id, keys_args[:numkeys], keys_args[numkeys:])
        return [as_text(x) for x in out]

    def append_events_call(
        self, run_id: str, payloads: list[str], fence: EventFence | None = None
    ) -> tuple[tuple[Any, ...], str]:
        """:meth:`append_events` of already encoded event JSONs as ``(command,
        source)`` for the caller's own pipeline (see :meth:`journal_call_call`);
        its reply is the entry ids. Under a ``fence`` (``append_events_fenced.lua``)
        nothing is appended, with an error reply ``FENCED`` (:meth:`script_error`
        -> :class:`RunLeaseLostError`), once it no longer holds: a lead
        segment's lease lost, or a later claim of the work item began writing."""
        k = self.keys(run_id)
        if fence is None:
            return self._call("append_events", [k.record, k.events], [self.max_events, *payloads])
        return self._call(
            "append_events_fenced", [k.record, k.events, fence.key], [self.max_events, *fence.args, *payloads]
        )

    def lead_events_fence(self, run_id: str, token: str) -> EventFence:
        """The fence of a lead segment's events: the run is ``running`` under the
        lease ``token`` (raises ``ValueError`` on a bad run id or an empty token)."""
        if not token:
            raise ValueError("a lead events fence needs the segment's lease token")
        return EventFence(run_id, self.keys(run_id).record, ("lead", token, "", ""))

    async def events(
        self,
        run_id: str,
        last_id: str = "0-0",
        block_ms: int | None = None,
        count: int = 100,
    ) -> list[tuple[str, dict[str, Any]]]:
        """Events after stream id ``last_id``, oldest first, at most ``count``.

        ``block_ms`` (milliseconds): wait up to that long for the first new
        event (``None`` = do not wait; ``0`` = wait forever, as Redis
        ``XREAD BLOCK 0``). Returns ``[]`` when nothing arrived. Each entry is
        ``(stream_id, event_dict)``.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be a positive integer, got {count!r}")
        if block_ms is not None and (
            isinstance(block_ms, bool) or not isinstance(block_ms, int) or block_ms < 0
        ):
            raise ValueError(f"block_ms must be None or an integer >= 0, got {block_ms!r}")
        key = self.keys(run_id).events
        client = self._conn().client
        reply = await read_again(lambda: client.xread({key: last_id}, count=count, block=block_ms))
        return [(as_text(entry_id), decode_event(fields)) for entry_id, fields in stream_entries(reply)]

    async def final_result(self, run_id: str) -> tuple[bool, RunResult | None]:
        """``(exists, result)`` from the run record (one ``HMGET``): whether the
        run exists, and its final result once it has one."""
        client, record = self._conn().client, self.keys(run_id).record
        return final_from_reply(await read_again(lambda: client.hmget(record, ["status", "result"])))

    async def read_result(self, run_id: str, block_ms: int | None = None) -> RunResult | None:
        """The final result from the run's result stream (:meth:`result_key`),
        or ``None`` when it has none. ``block_ms`` (milliseconds, >= 1): wait up
        to that long for it (``None`` = do not wait)."""
        check_block_ms(block_ms)
        client, stream = self._conn().client, self.result_key(run_id)
        return result_from_reply(
            await read_again(lambda: client.xread({stream: "0-0"}, count=1, block=block_ms))
        )

    async def finish(self, run_id: str, result: RunResult, *, token: str | None = None) -> bool:
        """Store the final ``result`` (status ``completed`` or ``failed``) and
        append the ``{"type": "run_result", ...}`` event, once.

        Returns False (nothing written) when the run already finished or was
        cancelled. ``token``: the calling lead segment's lease token; when
        given, the run must be running under it, else
        :class:`RunLeaseLostError` and nothing is written. Raises
        :class:`RunNotFoundError`, or ``ValueError`` when ``result.run_id``
        differs or its status is ``cancelled`` (use :meth:`cancel`).
        """
        if not isinstance(result, RunResult):
            result = RunResult.model_validate(result)
        (_, _, numkeys, *keys_args), _ = self.finish_call(run_id, result, token or "")
        if not token:
            return bool(await self._run("finish", run_id, keys_args[:numkeys], keys_args[numkeys:]))

        # The segment ends: out of the lease index in the same round trip. That
        # is right whatever the script answers (the run ended, now or before),
        # except a refused token: another segment holds the run, its entry goes back.
        def build(pipe: Any, scripts: dict[str, AsyncScript]) -> None:
            pipe.evalsha(scripts["finish"].sha, numkeys, *keys_args)
            pipe.zrem(self.leases_key, run_id)  # idempotent: may be sent twice

        try:
            ok = (await self._pipeline(build))[0]
        except ResponseError as exc:
            mapped = self.script_error(exc, run_id, "finish")
            if isinstance(mapped, RunLeaseLostError):
                await self.reindex_lease(run_id)
            if mapped is exc:
                raise
            raise mapped from None
        return bool(ok)

    def finish_call(self, run_id: str, result: RunResult, token: str) -> tuple[tuple[Any, ...], str]:
        """:meth:`finish` as ``(command, source)`` for the caller's own
        pipeline (see :meth:`journal_call_call`); its reply is 1 (finished
        now) or 0. Under a ``token`` (``""``: none) the caller removes
        ``run_id`` from :attr:`leases_key` with it, and on a refused token
        (``FENCED``, see :meth:`script_error`) calls :meth:`reindex_lease`.
        Raises ``ValueError`` like :meth:`finish`."""
        if result.run_id != run_id:
            raise ValueError(f"result.run_id {result.run_id!r} does not match run {run_id!r}")
        if result.status == "cancelled":
            raise ValueError("finish() takes a completed or failed result; use cancel() to cancel")
        k = self.keys(run_id)
        args = [
            result.status,
            result.model_dump_json(),
            dumps(result.to_event(), "result"),
            self.max_events,
            now_ms(),
            token,
        ]
        return self._call("finish", [k.record, k.events, self.result_key(run_id)], args)

    async def cancel(self, run_id: str, *, reason: str = "cancelled by request") -> list[dict[str, Any]]:
        """Cancel the run unless it already completed or failed.

        Sets status ``cancelled``, stores a cancelled :class:`RunResult`
        (``error=reason``), appends its ``run_result`` event and drops the
        not-yet-dispatched queue. Returns the run's unfinished items (registered,
        not completed) so the caller can cancel their mailbox messages; a repeated
        cancel appends nothing but lists them again; a completed or failed run
        returns ``[]`` unchanged. A call whose connection was lost is made again
        (a repeated cancel changes nothing more). Raises :class:`RunNotFoundError`.
        """
        result = RunResult(run_id=run_id, status="cancelled", error=reason)
        k = self.keys(run_id)
        keys = [k.record, k.events, k.order, k.state, k.items, k.queued, self.result_key(run_id)]
        args = [result.model_dump_json(), dumps(result.to_event(), "result"), self.max_events, now_ms()]
        # cancel.lua may run twice (see its header): read_again's "call again" is safe here
        out = await read_again(lambda: self._run("cancel", run_id, keys, args))
        return [json.loads(as_text(x)) for x in out[1:]]


__all__ = ["RunEvents"]
