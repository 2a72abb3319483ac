"""Run records: create, read, set a status, list and delete runs."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from redis import Redis as SyncRedis
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from lattice_mailbox.connections import read_again

from ..models import RunParent, RunRecord, RunStatus
from .budgets import check_tokens
from .core import RunStoreCore
from .records import as_text, dumps, now_ms, parse_record
from .scripts import SCRIPTS, SHAS


class RunRecords(RunStoreCore):
    """Run records (part of :class:`~lattice_client.runstore.RunStore`)."""

    async def create(
        self,
        run_id: str,
        team: str,
        prompt: str,
        *,
        team_ref: str | None = None,
        metadata: dict[str, Any] | None = None,
        parent: RunParent | dict[str, Any] | None = None,
        budget_tokens: int | None = None,
    ) -> RunRecord:
        """Create run ``run_id`` in status ``queued`` and index it.

        ``budget_tokens``: the run's token budget (a positive int; ``None``: none).

        When the reply is lost (the connection drops after Redis ran it), the
        stored record decides: this call's own record means it was created (its
        index entries are written again, idempotently); otherwise the
        ``redis.exceptions.ConnectionError`` / ``TimeoutError`` is raised.
        Raises ``ValueError`` when the run id already exists (nothing is
        overwritten), on a bad run id, an empty team, a non-string prompt,
        metadata that is not a JSON object, or a malformed ``parent``
        (``{run_id, message_id, mailbox_id}``).
        """
        commands, record = self._create_commands(
            run_id, team, prompt, team_ref, metadata, parent, budget_tokens
        )

        def build(pipe: Any, scripts: dict[str, AsyncScript]) -> None:
            for command in commands:
                pipe.execute_command(*command)

        try:
            replies = await self._pipeline(build)
        except (RedisConnectionError, RedisTimeoutError):
            if not await self._created_by(record):
                raise
            async with self._conn().client.pipeline(transaction=False) as pipe:
                for command in commands[1:]:  # the index entries (NX: idempotent) may be missing
                    pipe.execute_command(*command)
                await pipe.execute()
            return record
        stale = self._create_refused(commands, replies)
        if stale is not None:
            if stale:
                async with self._conn().client.pipeline(transaction=False) as pipe:
                    for index in stale:
                        pipe.zrem(index, run_id)
                    await pipe.execute()
            raise ValueError(f"run {run_id!r} already exists")
        return record

    async def _created_by(self, record: RunRecord) -> bool:
        """After a create whose reply was lost: whether the stored record is the one
        ``record`` describes (same team, prompt and creation time in ms: that
        call's own), i.e. the create took effect. ``False`` when it cannot be read."""
        try:
            stored = await read_again(lambda: self.get(record.run_id))
        except (RedisConnectionError, RedisTimeoutError):
            return False
        return stored is not None and (stored.team, stored.prompt, stored.created_at) == (
            record.team,
            record.prompt,
            record.created_at,
        )

    def create_blocking(
        self,
        client: SyncRedis,
        run_id: str,
        team: str,
        prompt: str,
        *,
        team_ref: str | None = None,
        metadata: dict[str, Any] | None = None,
        parent: RunParent | dict[str, Any] | None = None,
        budget_tokens: int | None = None,
    ) -> RunRecord:
        """:meth:`create` through the blocking Redis client ``client`` (of the
        same server), for callers outside an event loop (the blocking client)."""
        commands, record = self._create_commands(
            run_id, team, prompt, team_ref, metadata, parent, budget_tokens
        )
        replies: list[Any] = []
        for attempt in range(2):  # as _pipeline: once more after loading the scripts
            with client.pipeline(transaction=False) as pipe:
                for command in commands:
                    pipe.execute_command(*command)
                replies = pipe.execute(raise_on_error=False)
            errors = [r for r in replies if isinstance(r, Exception)]
            if not errors:
                break
            if attempt == 0 and any(isinstance(e, NoScriptError) for e in errors):
                for source in SCRIPTS.values():
                    client.script_load(source)
                continue
            raise errors[0]
        stale = self._create_refused(commands, replies)
        if stale is not None:
            if stale:
                with client.pipeline(transaction=False) as pipe:
                    for index in stale:
                        pipe.zrem(index, run_id)
                    pipe.execute()
            raise ValueError(f"run {run_id!r} already exists")
        return record

    def _create_commands(
        self,
        run_id: str,
        team: str,
        prompt: str,
        team_ref: str | None,
        metadata: dict[str, Any] | None,
        parent: RunParent | dict[str, Any] | None,
        budget_tokens: int | None = None,
    ) -> tuple[list[tuple[Any, ...]], RunRecord]:
        # create's checks, its pipeline (the record, then its index entries: one
        # round trip; NX: an existing entry is never moved; the script and ZADD NX
        # may be sent twice) and the record it writes
        keys = self.keys(run_id)
        if not isinstance(team, str) or not team:
            raise ValueError(f"team must be a non-empty string, got {team!r}")
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
        if metadata is not None and not isinstance(metadata, dict):
            raise ValueError(f"metadata must be a dict, got {type(metadata).__name__}")
        try:
            parent_model = RunParent.model_validate(parent) if parent is not None else None
        except ValidationError as exc:
            raise ValueError(f"invalid parent: {exc}") from None
        if budget_tokens is not None:
            check_tokens(budget_tokens)
        meta = dict(metadata or {})
        meta_json = dumps(meta, "metadata")
        parent_json = parent_model.model_dump_json() if parent_model is not None else ""
        created = now_ms()
        budget = str(budget_tokens) if budget_tokens is not None else ""
        args = [run_id, team, team_ref or "", prompt, created, meta_json, parent_json, budget]
        commands: list[tuple[Any, ...]] = [
            ("EVALSHA", SHAS["create"], 1, keys.record, *args),
            ("ZADD", self.runs_index_key, "NX", created, run_id),
            ("ZADD", self.team_index_key(team), "NX", created, run_id),
        ]
        record = RunRecord(
            run_id=run_id,
            team=team,
            team_ref=team_ref,
            prompt=prompt,
            status=RunStatus.QUEUED,
            created_at=created,
            updated_at=created,
            metadata=meta,
            parent=parent_model,
            budget_tokens=budget_tokens,
            spent_tokens=0 if budget_tokens is not None else None,
        )
        return commands, record

    @staticmethod
    def _create_refused(commands: list[tuple[Any, ...]], replies: list[Any]) -> list[str] | None:
        # None when the run was created; else the index keys whose entry this call
        # added and must take back (only after a NOSCRIPT resend could one stay)
        ok, *added = replies
        if int(ok):
            return None
        return [command[1] for command, was_added in zip(commands[1:], added, strict=True) if int(was_added)]

    async def status(self, run_id: str) -> RunStatus | None:
        """The run's status alone (one ``HGET``), or ``None`` when there is no such run."""
        raw = await self._conn().client.hget(self.keys(run_id).record, "status")
        return RunStatus.parse(as_text(raw)) if raw is not None else None

    async def status_and_parent(self, run_id: str) -> tuple[RunStatus | None, RunParent | None]:
        """The run's status and its ``parent`` (a nested team's child run) in one
        ``HMGET``: ``(None, None)`` when there is no such run, parent ``None``
        for a root run. A read whose connection was lost is made again (``read_again``)."""
        client = self._conn().client
        record = self.keys(run_id).record
        status, parent = await read_again(lambda: client.hmget(record, ["status", "parent"]))
        if status is None:
            return None, None
        link = RunParent.model_validate_json(as_text(parent)) if parent else None
        return RunStatus.parse(as_text(status)), link

    async def get(self, run_id: str) -> RunRecord | None:
        """The run record, or ``None`` when there is no such run."""
        raw = await self._conn().client.hgetall(self.keys(run_id).record)
        if not raw:
            return None
        return parse_record({as_text(k): as_text(v) for k, v in raw.items()})

    async def set_status(
        self, run_id: str, status: RunStatus | str, *, expect: RunStatus | str | None = None
    ) -> bool:
        """Set a non-final status (``queued|running|suspended|resuming``).

        With ``expect`` this is a compare-and-set: it only happens when the
        current status is ``expect``. Returns False when refused: unknown run,
        status mismatch, or a run that already finished (final statuses are
        written only by :meth:`finish` and :meth:`cancel`). Raises ``ValueError``
        for an unknown status value or a final target status.
        """
        target = RunStatus.parse(status)
        if target.finished:
            raise ValueError(f"set_status cannot write {target.value!r}: use finish() or cancel()")
        expected = RunStatus.parse(expect).value if expect is not None else ""
        keys = self.keys(run_id)
        return bool(await self._run("set_status", run_id, [keys.record], [target.value, expected, now_ms()]))

    async def begin_resume(self, run_id: str) -> bool:
        """``resuming`` -> ``running``, exactly once: a duplicated resume task
        gets False (as does an unknown or cancelled run)."""
        return await self.set_status(run_id, RunStatus.RUNNING, expect=RunStatus.RESUMING)

    async def list_runs(self, team: str | None = None, limit: int = 50) -> list[RunRecord]:
        """The most recent runs (newest first), of one team or of all, at most
        ``limit`` (>= 1). Index entries whose record is gone are dropped."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        client = self._conn().client
        index = self.team_index_key(team) if team is not None else self.runs_index_key
        run_ids = [as_text(x) for x in await client.zrevrange(index, 0, limit - 1)]
        if not run_ids:
            return []
        async with client.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.hgetall(self.keys(run_id).record)
            raws = await pipe.execute()
        records: list[RunRecord] = []
        stale: list[str] = []
        for run_id, raw in zip(run_ids, raws, strict=True):
            if raw:
                records.append(parse_record({as_text(k): as_text(v) for k, v in raw.items()}))
            else:
                stale.append(run_id)
        if stale:
            await client.zrem(index, *stale)
        return records

    async def delete(self, run_id: str) -> bool:
        """Delete every key of the run and its index entries (for finished runs
        whose record is no longer needed). Returns False for an unknown run."""
        record = await self.get(run_id)
        if record is None:
            return False
        k = self.keys(run_id)
        client = self._conn().client
        async with client.pipeline(transaction=False) as pipe:
            pipe.delete(
                k.record,
                k.events,
                k.items,
                k.order,
                k.state,
                k.outcomes,
                k.wait,
                k.queued,
                k.active,
                k.calls,
                self.result_key(run_id),
                f"{k.record}:budget_waits",
            )
            pipe.zrem(self.runs_index_key, run_id)
            pipe.zrem(self.leases_key, run_id)
            pipe.zrem(self.team_index_key(record.team), run_id)
            await pipe.execute()
        return True


__all__ = ["RunRecords"]
