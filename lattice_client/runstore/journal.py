"""The lead's call journal and its fenced history writes."""

from __future__ import annotations

import json
from typing import Any

from .core import RunStoreCore
from .records import as_text, dumps


class RunJournal(RunStoreCore):
    """The call journal and fenced history writes (part of :class:`~lattice_client.runstore.RunStore`)."""

    async def journal_call(
        self, run_id: str, token: str, tool_use_id: str, entry: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Record, before the task message is sent, that the lead's tool call
        ``tool_use_id`` sends member work ``entry`` (JSON object: work_item_id,
        mailbox_id, member, mode, tool_use_id). Returns the entry journaled
        earlier for the same call (a recovering segment replays its batch: reuse
        that work item, do not send again), or ``None`` when written now. Raises
        :class:`RunLeaseLostError` when ``token`` does not hold the run (nothing
        may be sent)."""
        (_, _, _, *keys_args), _ = self.journal_call_call(run_id, token, tool_use_id, entry)
        out = await self._run("journal_call", run_id, keys_args[:2], keys_args[2:])
        return self.journal_reply(out)

    def journal_call_call(
        self, run_id: str, token: str, tool_use_id: str, entry: dict[str, Any]
    ) -> tuple[tuple[Any, ...], str]:
        """:meth:`journal_call` as ``(command, source)`` for the caller's own
        pipeline: ``command`` is ``("evalsha", sha, numkeys, *keys, *args)``;
        on a NOSCRIPT reply load ``source`` and send it again. Read its reply
        with :meth:`journal_reply`, map an error reply with :meth:`script_error`.
        Raises ``ValueError`` for an empty ``tool_use_id`` or an entry that is
        not JSON-serialisable."""
        if not isinstance(tool_use_id, str) or not tool_use_id:
            raise ValueError(f"tool_use_id must be a non-empty string, got {tool_use_id!r}")
        k = self.keys(run_id)
        return self._call(
            "journal_call", [k.record, k.calls], [token, tool_use_id, dumps(entry, "journal entry")]
        )

    @staticmethod
    def journal_reply(reply: Any) -> dict[str, Any] | None:
        """The entry journaled earlier (a dict) from a ``journal_call`` reply, or ``None``."""
        text = as_text(reply) if reply is not None else ""
        return json.loads(text) if text else None

    async def journal(self, run_id: str) -> dict[str, dict[str, Any]]:
        """The call journal of the batch in progress: ``{tool_use_id: entry}``
        (empty once the batch's items are registered)."""
        raw = await self._conn().client.hgetall(self.keys(run_id).calls)
        return {as_text(a): json.loads(as_text(b)) for a, b in raw.items()}

    async def clear_journal(self, run_id: str) -> None:
        """Forget the call journal (a recovering segment found nothing of it sent)."""
        await self._conn().client.delete(self.keys(run_id).calls)

    async def write_history(
        self,
        run_id: str,
        token: str,
        key: str,
        values: list[str | bytes],
        *,
        replace: bool = False,
        ttl_ms: int | None = None,
    ) -> int:
        """Append ``values`` (encoded messages) to the history list ``key`` of
        run ``run_id`` -- or replace its content with them -- only while
        ``token`` holds the run (else :class:`RunLeaseLostError`, nothing
        written). ``key`` must carry the run's hash tag (``{run:<run_id>}``);
        ``ttl_ms``: expiry of the list in milliseconds. Returns its length."""
        (_, _, _, *keys_args), _ = self.write_history_call(
            run_id, token, key, values, replace=replace, ttl_ms=ttl_ms
        )
        return int(await self._run("write_history", run_id, keys_args[:2], keys_args[2:]))

    def write_history_call(
        self,
        run_id: str,
        token: str,
        key: str,
        values: list[str | bytes],
        *,
        replace: bool = False,
        ttl_ms: int | None = None,
    ) -> tuple[tuple[Any, ...], str]:
        """:meth:`write_history` as ``(command, source)`` for the caller's own
        pipeline (see :meth:`journal_call_call`); its reply is the list's
        length. Raises ``ValueError`` when ``key`` is not a key of the run."""
        k = self.keys(run_id)
        if not key.startswith(k.record + ":"):
            raise ValueError(f"history key {key!r} is not a key of run {run_id!r}")
        args: list[Any] = [token, "replace" if replace else "append", "" if ttl_ms is None else int(ttl_ms)]
        return self._call("write_history", [k.record, key], args + list(values))


__all__ = ["RunJournal"]
