"""The run store: run records, per-run work-item wait sets and event streams in Redis.

Design: DESIGN.md section 5, steps 1-4 (submit, suspend, complete, resume) and
"Lua scripts" / "Redis keys". Every multi-key operation is one Lua script from
``lattice_client/lua/`` (one file per operation; each lists its KEYS, ARGV,
return values and errors). Keys are passed in ``KEYS[]``; all keys of one run
share the hash tag ``{run:<run_id>}``, so the scripts are Redis Cluster-safe.

Key layout (``P`` = the key prefix, ``R`` = ``P:run:{run:<run_id>}``):

=====================  ======  ===============================================
key                    type    content
=====================  ======  ===============================================
``R``                  hash    the run record (see :class:`RunRecord`)
``R:events``           stream  the run's events, field ``data`` = JSON object
``R:result``           stream  the ``run_result`` event alone (what ``wait`` blocks on)
``R:items``            hash    work_item_id -> item JSON
``R:order``            list    work_item_ids in registration order
``R:state``            hash    work_item_id -> ``queued|dispatched|done``
``R:outcomes``         hash    work_item_id -> outcome JSON
``R:wait``             set     unfinished work_item_ids (the wait set)
``R:queued``           list    registered, not yet dispatched
``R:active``           set     dispatched, not finished
``R:calls``            hash    tool_use_id -> member call JSON (the lead's batch in progress)
``P:runs``             zset    run ids by creation time (ms)
``P:runs:team:<team>`` zset    the same, per team
``P:runs:leased``      zset    run ids of running lead segments by ``lease_until`` (ms)
=====================  ======  ===============================================

Lead leases (DESIGN.md section 5, "Crash"): while a lead segment runs, the run
record holds ``lease_token`` and ``lease_until`` (ms) and ``lead_attempts``
counts the segment's starts since the last suspension. The segment renews the
lease (:meth:`RunStore.extend_lead_lease`); the reaper takes over a run whose
lease expired (:meth:`RunStore.recover_lead`). Every write a segment makes
(history, call journal, work items, suspension, final result) can carry its
token and is refused with :class:`~lattice_client.errors.RunLeaseLostError`
once the token no longer holds the run.

The asyncio Redis client is created lazily per running event loop (never shared
across loops) when the store is built from a URL; a client passed in is used
as is (its owner keeps it on one loop).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from .errors import RunLeaseLostError, RunNotFoundError, RunStateError
from .models import RunParent, RunRecord, RunResult, RunStatus
from .settings import KEY_PREFIX_PATTERN

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
"""Allowed run ids: 1-128 characters from ``[A-Za-z0-9_.:-]``."""

DEFAULT_MAX_EVENTS = 10_000
"""Default approximate length bound of a run's event stream (entries)."""

_SCRIPT_NAMES = (
    "create",
    "set_status",
    "add_items",
    "complete_item",
    "suspend",
    "clear_items",
    "append_event",
    "append_events",
    "finish",
    "cancel",
    "begin_segment",
    "extend_lead_lease",
    "recover_lead",
    "journal_call",
    "write_history",
)


def _load_scripts() -> dict[str, str]:
    base = resources.files("lattice_client").joinpath("lua")
    return {name: base.joinpath(f"{name}.lua").read_text(encoding="utf-8") for name in _SCRIPT_NAMES}


_SCRIPTS = _load_scripts()
_SHAS = {name: hashlib.sha1(src.encode("utf-8")).hexdigest() for name, src in _SCRIPTS.items()}


def now_ms() -> int:
    """Milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` or raise ``ValueError`` when it is not 1-128 characters
    of ``[A-Za-z0-9_.:-]`` (it becomes part of Redis keys and a hash tag)."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id):
        raise ValueError(f"invalid run id {run_id!r}: expected 1-128 characters of [A-Za-z0-9_.:-]")
    return run_id


def dumps(value: Any, what: str) -> str:
    """Compact JSON; raise ``ValueError`` naming ``what`` when it is not serialisable."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serialisable: {exc}") from None


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class WorkItem(BaseModel):
    """Validation of one work item given to :meth:`RunStore.add_items`.

    Required: ``work_item_id``, ``message_id`` (the mailbox message carrying the
    work), ``mailbox_id``. Usual: ``member``, ``mode`` (``ask|handoff|observe``),
    ``tool_use_id``. Other keys are kept as given.
    """

    model_config = ConfigDict(extra="allow")

    work_item_id: str = Field(min_length=1)
    message_id: str = Field(min_length=1)
    mailbox_id: str = Field(min_length=1)
    member: str | None = None
    mode: str | None = None
    tool_use_id: str | None = None


@dataclass(frozen=True)
class CompleteResult:
    """What :meth:`RunStore.complete_item` decided.

    ``resume``: True exactly once per suspension: this completion emptied the
    wait set of a ``suspended`` run, which is now ``resuming`` (the caller sends
    ``lattice.resume_lead``). ``dispatch``: queued items that may be dispatched
    now (ring their doorbells). ``recorded``: False when the item was unknown,
    cleared or already completed (then nothing changed). ``run_status``: the
    run's status afterwards, so a caller can tell that nobody will read the
    outcome (a finished or cancelled run).
    """

    resume: bool
    dispatch: list[dict[str, Any]] = field(default_factory=list)
    recorded: bool = True
    run_status: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class SegmentStart:
    """A lead segment that :meth:`RunStore.begin_segment` started.

    ``token``: the lease token (pass it to every fenced write); ``lease_until``:
    ms since the epoch; ``attempts``: starts of this segment since the run's
    last suspension (1 on the first try); ``recover``: True when a worker died
    in the previous try and the segment must rebuild its state from the
    persisted history."""

    token: str
    lease_until: int
    attempts: int
    recover: bool
    record: RunRecord | None = None
    """The run record right after the start (``begin_segment(..., read_record=True)``)."""
    history: list[str] | None = None
    """The elements of the list ``begin_segment(..., history_key=)`` names, read
    right after the start (``[]`` when it does not exist)."""
    items: list[dict[str, Any]] | None = None
    """The run's registered items as :meth:`RunStore.items` lists them, read right
    after the start (``begin_segment(..., read_items=True)``)."""
    usage: dict[str, int] | None = None
    """The integer fields of the hash ``begin_segment(..., usage_key=)`` names
    (the worker's token usage totals), read right after the start."""


@dataclass(frozen=True)
class LeadRecovery:
    """What :meth:`RunStore.recover_lead` did to one run: ``action`` is
    ``"alive"`` (the lease is current; ``lease_until`` says until when),
    ``"gone"`` (not running any more, or unknown), ``"requeued"`` (now
    ``resuming`` with the recover flag: send ``lattice.resume_lead``) or
    ``"failed"`` (its attempts were used up; ``result`` is what was stored).
    ``attempts``: the expired segment's starts."""

    action: str
    attempts: int = 0
    lease_until: int | None = None
    result: RunResult | None = None
    record: RunRecord | None = None


@dataclass(frozen=True)
class RunKeys:
    """The Redis keys of one run (all share the hash tag ``{run:<run_id>}``)."""

    record: str
    events: str
    items: str
    order: str
    state: str
    outcomes: str
    wait: str
    queued: str
    active: str
    calls: str = ""


@dataclass
class _Conn:
    client: Redis
    scripts: dict[str, AsyncScript]


class RunStore:
    """Runs, their work items and their event streams in Redis.

    ``redis_url_or_client``: a ``redis://`` URL (a client is then created per
    running event loop) or a ``redis.asyncio.Redis``. ``prefix``: the key prefix
    (``[A-Za-z0-9_.-]+``). ``max_events``: approximate bound of each run's
    event stream. Raises ``ValueError`` on a bad prefix.

    Redis failures surface as ``redis.exceptions.ConnectionError`` /
    ``TimeoutError``; every write is one atomic script, so a failed call either
    happened completely or not at all.
    """

    def __init__(
        self,
        redis_url_or_client: str | Redis,
        prefix: str = "lattice",
        *,
        max_events: int = DEFAULT_MAX_EVENTS,
    ) -> None:
        if not isinstance(prefix, str) or not KEY_PREFIX_PATTERN.fullmatch(prefix):
            raise ValueError(f"invalid key prefix {prefix!r}: expected [A-Za-z0-9_.-]+")
        if not isinstance(max_events, int) or max_events < 1:
            raise ValueError(f"max_events must be a positive integer, got {max_events!r}")
        self.prefix = prefix
        self.max_events = max_events
        self._url: str | None = None
        self._shared: _Conn | None = None
        if isinstance(redis_url_or_client, str):
            self._url = redis_url_or_client
        elif isinstance(redis_url_or_client, Redis):
            self._shared = self._make_conn(redis_url_or_client)
        else:
            raise TypeError("RunStore needs a redis:// URL or a redis.asyncio.Redis client")
        self._keys: dict[str, RunKeys] = {}  # immutable, asked for on every call
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Conn] = (
            weakref.WeakKeyDictionary()
        )

    # -- connection ---------------------------------------------------------------------------

    @staticmethod
    def _make_conn(client: Redis) -> _Conn:
        return _Conn(client, {name: client.register_script(src) for name, src in _SCRIPTS.items()})

    def _conn(self) -> _Conn:
        if self._shared is not None:
            return self._shared
        loop = asyncio.get_running_loop()
        conn = self._per_loop.get(loop)
        if conn is None:
            assert self._url is not None
            conn = self._make_conn(Redis.from_url(self._url, decode_responses=True))
            self._per_loop[loop] = conn
        return conn

    async def redis(self) -> Redis:
        """The Redis client of the running event loop (created on first use)."""
        return self._conn().client

    async def aclose(self) -> None:
        """Close the client of the running event loop (a client passed in is
        left to its owner). Other loops' clients go away with their loops."""
        if self._shared is not None:
            return
        loop = asyncio.get_running_loop()
        conn = self._per_loop.pop(loop, None)
        if conn is not None:
            await conn.client.aclose()

    async def _pipeline(self, build: Callable[[Any, dict[str, AsyncScript]], None]) -> list[Any]:
        """Execute the non-transactional pipeline ``build(pipe, scripts)`` queues
        and return its replies (the first error reply is raised). Its scripts
        are called by ``EVALSHA`` (``scripts[name].sha``), not through redis-py's
        pipeline registration, which costs a ``SCRIPT EXISTS`` round trip per
        execution. When the server lacks a script (first use, ``SCRIPT FLUSH``)
        the scripts are loaded and the pipeline is sent again: only pipeline
        commands that are idempotent beside a refused (not run) script."""
        conn = self._conn()
        for attempt in range(2):
            async with conn.client.pipeline(transaction=False) as pipe:
                build(pipe, conn.scripts)
                replies = await pipe.execute(raise_on_error=False)
            errors = [r for r in replies if isinstance(r, Exception)]
            if not errors:
                return replies
            if attempt == 0 and any(isinstance(e, NoScriptError) for e in errors):
                for script in conn.scripts.values():
                    await conn.client.script_load(script.script)
                continue
            raise errors[0]  # as the server said it (NORUN, FENCED... for script_error)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _run(self, name: str, run_id: str, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self._conn().scripts[name](keys=keys, args=args)
        except ResponseError as exc:
            mapped = self.script_error(exc, run_id, name)
            if mapped is exc:
                raise
            raise mapped from None

    @staticmethod
    def script_error(exc: BaseException, run_id: str, operation: str) -> BaseException:
        """The exception a run-store method raises for the error reply ``exc``
        of one of its scripts: :class:`RunNotFoundError` for ``NORUN``,
        :class:`RunLeaseLostError` (naming ``operation``) for ``FENCED``, else
        ``exc`` itself. For callers that send script calls in their own
        pipelines (:meth:`write_history_call`, :meth:`journal_call_call`)."""
        message = str(exc) if isinstance(exc, ResponseError) else ""
        if message.startswith("NORUN"):
            return RunNotFoundError(run_id)
        if message.startswith("FENCED"):
            return RunLeaseLostError(run_id, operation)
        return exc

    @staticmethod
    def _call(name: str, keys: list[str], args: list[Any]) -> tuple[tuple[Any, ...], str]:
        return ("evalsha", _SHAS[name], len(keys), *keys, *args), _SCRIPTS[name]

    # -- keys ---------------------------------------------------------------------------------

    def keys(self, run_id: str) -> RunKeys:
        """The keys of run ``run_id`` (raises ``ValueError`` on a bad run id)."""
        found = self._keys.get(run_id) if isinstance(run_id, str) else None
        if found is None:
            found = self._make_keys(run_id)
            if len(self._keys) >= 10_000:
                self._keys.clear()
            self._keys[run_id] = found
        return found

    def _make_keys(self, run_id: str) -> RunKeys:
        base = f"{self.prefix}:run:{{run:{check_run_id(run_id)}}}"
        return RunKeys(
            record=base,
            events=f"{base}:events",
            items=f"{base}:items",
            order=f"{base}:order",
            state=f"{base}:state",
            outcomes=f"{base}:outcomes",
            wait=f"{base}:wait",
            queued=f"{base}:queued",
            active=f"{base}:active",
            calls=f"{base}:calls",
        )

    @property
    def runs_index_key(self) -> str:
        """The sorted set of every run id by creation time (ms)."""
        return f"{self.prefix}:runs"

    @property
    def leases_key(self) -> str:
        """The sorted set of runs with a lead segment running, by ``lease_until`` (ms)."""
        return f"{self.prefix}:runs:leased"

    def team_index_key(self, team: str) -> str:
        """The sorted set of one team's run ids by creation time (ms)."""
        return f"{self.prefix}:runs:team:{team}"

    # -- records ------------------------------------------------------------------------------

    async def create(
        self,
        run_id: str,
        team: str,
        prompt: str,
        *,
        team_ref: str | None = None,
        metadata: dict[str, Any] | None = None,
        parent: RunParent | dict[str, Any] | None = None,
    ) -> RunRecord:
        """Create run ``run_id`` in status ``queued`` and index it.

        Raises ``ValueError`` when the run id already exists (nothing is
        overwritten), on a bad run id, an empty team, a non-string prompt,
        metadata that is not a JSON object, or a malformed ``parent``
        (``{run_id, message_id, mailbox_id}``).
        """
        commands, record = self._create_commands(run_id, team, prompt, team_ref, metadata, parent)

        def build(pipe: Any, scripts: dict[str, AsyncScript]) -> None:
            for command in commands:
                pipe.execute_command(*command)

        stale = self._create_refused(commands, await self._pipeline(build))
        if stale is not None:
            if stale:
                async with self._conn().client.pipeline(transaction=False) as pipe:
                    for index in stale:
                        pipe.zrem(index, run_id)
                    await pipe.execute()
            raise ValueError(f"run {run_id!r} already exists")
        return record

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
    ) -> RunRecord:
        """:meth:`create` through the blocking Redis client ``client`` (of the
        same server), for callers outside an event loop (the blocking client)."""
        commands, record = self._create_commands(run_id, team, prompt, team_ref, metadata, parent)
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
                for source in _SCRIPTS.values():
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
        meta = dict(metadata or {})
        meta_json = dumps(meta, "metadata")
        parent_json = parent_model.model_dump_json() if parent_model is not None else ""
        created = now_ms()
        args = [run_id, team, team_ref or "", prompt, created, meta_json, parent_json]
        commands: list[tuple[Any, ...]] = [
            ("EVALSHA", _SHAS["create"], 1, keys.record, *args),
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
        return RunStatus.parse(_text(raw)) if raw is not None else None

    async def get(self, run_id: str) -> RunRecord | None:
        """The run record, or ``None`` when there is no such run."""
        raw = await self._conn().client.hgetall(self.keys(run_id).record)
        if not raw:
            return None
        return _parse_record({_text(k): _text(v) for k, v in raw.items()})

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

    # -- work items ---------------------------------------------------------------------------

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
        return [json.loads(_text(x)) for x in reply]

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
            dispatch=[json.loads(_text(x)) for x in out[3:]],
            recorded=bool(int(out[0])),
            run_status=_text(out[2]) or None,
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
        return _parse_items(order, items, states, outcomes)

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

    # -- lead leases (DESIGN.md section 5, "Crash") --------------------------------------------

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
        lease_ms = _lease_ms(lease_s)
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
            raw = _pairs(out[3])
            record = _parse_record(raw) if raw else None
        if "h" in reads:
            history = [_text(x) for x in out[4]]
        if "i" in reads:
            items = _parse_items(out[5], _pairs(out[6]), _pairs(out[7]), _pairs(out[8]))
        if "u" in reads:
            usage = {}
            for name, value in _pairs(out[9]).items():
                try:
                    usage[name] = int(value)
                except ValueError:
                    continue
        return SegmentStart(
            token=token,
            lease_until=until,
            attempts=int(out[1]),
            recover=_text(out[2]) == "1",
            record=record,
            history=history,
            items=items,
            usage=usage,
        )

    async def extend_lead_lease(self, run_id: str, token: str, lease_s: float) -> bool:
        """Renew a running segment's lease to ``lease_s`` **seconds** from now.
        False when ``token`` no longer holds the run (taken over, cancelled,
        finished): the segment must stop."""
        lease_ms = _lease_ms(lease_s)
        until = now_ms() + lease_ms
        k = self.keys(run_id)
        ok = bool(await self._run("extend_lead_lease", run_id, [k.record], [token, until]))
        if ok:
            await self._conn().client.zadd(self.leases_key, {run_id: until}, gt=True)
        return ok

    async def reindex_lease(self, run_id: str) -> None:
        """Put a running run's lead lease back in the lease index (after a
        removal that turned out not to be the caller's to make: its ``finish``
        was refused, another segment holds the run)."""
        client = self._conn().client
        status, until = await client.hmget(self.keys(run_id).record, ["status", "lease_until"])
        if status is not None and _text(status) == RunStatus.RUNNING.value and until:
            await client.zadd(self.leases_key, {run_id: int(_text(until))}, gt=True)

    async def _unindex_lease(self, run_id: str) -> None:
        try:
            await self._conn().client.zrem(self.leases_key, run_id)
        except Exception:  # the reaper drops entries of runs that are not running
            pass

    async def expired_leads(self, *, now: int | None = None, limit: int = 100) -> list[str]:
        """Run ids in the lease index whose ``lease_until`` is at or before
        ``now`` (ms; default the current time), oldest first, at most ``limit``.
        Candidates only: :meth:`recover_lead` checks each record."""
        now = now_ms() if now is None else now
        raw = await self._conn().client.zrangebyscore(self.leases_key, "-inf", now, start=0, num=limit)
        return [_text(x) for x in raw]

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
            _text(x) if x is not None else None
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
        text = _text(reply) if reply is not None else ""
        return json.loads(text) if text else None

    async def journal(self, run_id: str) -> dict[str, dict[str, Any]]:
        """The call journal of the batch in progress: ``{tool_use_id: entry}``
        (empty once the batch's items are registered)."""
        raw = await self._conn().client.hgetall(self.keys(run_id).calls)
        return {_text(a): json.loads(_text(b)) for a, b in raw.items()}

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

    # -- events and results -------------------------------------------------------------------

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
        return _text(entry)

    async def append_events(self, run_id: str, events: list[dict[str, Any]]) -> list[str]:
        """Append ``events`` (as for :meth:`append_event`), in order, with one
        script call; returns their stream entry ids. Nothing is appended when
        one is bad (``ValueError``) or the run is unknown (:class:`RunNotFoundError`)."""
        for event in events:
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise ValueError("an event must be a dict with a string 'type'")
        if not events:
            return []
        (_, _, numkeys, *keys_args), _ = self.append_events_call(run_id, [dumps(e, "event") for e in events])
        out = await self._run("append_events", run_id, keys_args[:numkeys], keys_args[numkeys:])
        return [_text(x) for x in out]

    def append_events_call(self, run_id: str, payloads: list[str]) -> tuple[tuple[Any, ...], str]:
        """:meth:`append_events` of already encoded event JSONs as ``(command,
        source)`` for the caller's own pipeline (see :meth:`journal_call_call`);
        its reply is the entry ids."""
        k = self.keys(run_id)
        return self._call("append_events", [k.record, k.events], [self.max_events, *payloads])

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
        reply = await self._conn().client.xread({key: last_id}, count=count, block=block_ms)
        return [(_text(entry_id), _decode_event(fields)) for entry_id, fields in _stream_entries(reply)]

    def result_key(self, run_id: str) -> str:
        """The run's result stream ``R:result``: only its ``run_result`` event,
        appended (field ``data``) by the same script call that appends it to
        ``R:events`` (:meth:`finish`, :meth:`cancel`, :meth:`recover_lead`), so
        a waiter wakes once. Runs finished before this stream existed have none."""
        return f"{self.keys(run_id).record}:result"

    async def final_result(self, run_id: str) -> tuple[bool, RunResult | None]:
        """``(exists, result)`` from the run record (one ``HMGET``): whether the
        run exists, and its final result once it has one."""
        return final_from_reply(
            await self._conn().client.hmget(self.keys(run_id).record, ["status", "result"])
        )

    async def read_result(self, run_id: str, block_ms: int | None = None) -> RunResult | None:
        """The final result from the run's result stream (:meth:`result_key`),
        or ``None`` when it has none. ``block_ms`` (milliseconds, >= 1): wait up
        to that long for it (``None`` = do not wait)."""
        check_block_ms(block_ms)
        return result_from_reply(
            await self._conn().client.xread({self.result_key(run_id): "0-0"}, count=1, block=block_ms)
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
        returns ``[]`` unchanged. Raises :class:`RunNotFoundError`.
        """
        result = RunResult(run_id=run_id, status="cancelled", error=reason)
        k = self.keys(run_id)
        out = await self._run(
            "cancel",
            run_id,
            [k.record, k.events, k.order, k.state, k.items, k.queued, self.result_key(run_id)],
            [result.model_dump_json(), dumps(result.to_event(), "result"), self.max_events, now_ms()],
        )
        return [json.loads(_text(x)) for x in out[1:]]

    # -- listing and deletion -----------------------------------------------------------------

    async def list_runs(self, team: str | None = None, limit: int = 50) -> list[RunRecord]:
        """The most recent runs (newest first), of one team or of all, at most
        ``limit`` (>= 1). Index entries whose record is gone are dropped."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        client = self._conn().client
        index = self.team_index_key(team) if team is not None else self.runs_index_key
        run_ids = [_text(x) for x in await client.zrevrange(index, 0, limit - 1)]
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
                records.append(_parse_record({_text(k): _text(v) for k, v in raw.items()}))
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
            )
            pipe.zrem(self.runs_index_key, run_id)
            pipe.zrem(self.leases_key, run_id)
            pipe.zrem(self.team_index_key(record.team), run_id)
            await pipe.execute()
        return True


def check_block_ms(block_ms: int | None) -> None:
    """Raise ``ValueError`` unless ``block_ms`` is ``None`` or an integer >= 1
    (``XREAD BLOCK 0`` would wait forever)."""
    if block_ms is not None and (isinstance(block_ms, bool) or not isinstance(block_ms, int) or block_ms < 1):
        raise ValueError(f"block_ms must be None or an integer >= 1, got {block_ms!r}")


def final_from_reply(reply: Any) -> tuple[bool, RunResult | None]:
    """:meth:`RunStore.final_result` from the reply of ``HMGET <record> status
    result`` (for callers reading with their own Redis client)."""
    status, result = reply
    if status is None:
        return False, None
    return True, (RunResult.model_validate_json(result) if result else None)


def result_from_reply(reply: Any) -> RunResult | None:
    """:meth:`RunStore.read_result` from the reply of ``XREAD COUNT 1 ...
    STREAMS <result stream> 0-0`` (for callers reading with their own Redis client)."""
    for _, fields in _stream_entries(reply):
        event = _decode_event(fields)
        if event.get("type") == "run_result":
            return RunResult.model_validate(event)
    return None


def _lease_ms(lease_s: float) -> int:
    if isinstance(lease_s, bool) or not isinstance(lease_s, int | float) or not lease_s > 0:
        raise ValueError(f"lease_s must be a positive number of seconds, got {lease_s!r}")
    return max(1, int(lease_s * 1000))


def _pairs(flat: Any) -> dict[str, str]:
    """A dict of a flat ``[field, value, ...]`` reply (a Lua script's ``HGETALL``)."""
    it = iter(flat or ())
    return {_text(a): _text(b) for a, b in zip(it, it, strict=False)}


def _parse_items(order: Any, items: Any, states: Any, outcomes: Any) -> list[dict[str, Any]]:
    items = {_text(a): _text(b) for a, b in items.items()}
    states = {_text(a): _text(b) for a, b in states.items()}
    outcomes = {_text(a): _text(b) for a, b in outcomes.items()}
    result = []
    for raw_id in order:
        item_id = _text(raw_id)
        if item_id not in items:
            continue
        item = json.loads(items[item_id])
        item["state"] = states.get(item_id, "queued")
        item["outcome"] = json.loads(outcomes[item_id]) if item_id in outcomes else None
        result.append(item)
    return result


def _parse_record(raw: dict[str, str]) -> RunRecord:
    data: dict[str, Any] = {
        "run_id": raw["run_id"],
        "team": raw["team"],
        "team_ref": raw.get("team_ref") or None,
        "prompt": raw.get("prompt", ""),
        "status": raw["status"],
        "created_at": int(raw["created_at"]),
        "updated_at": int(raw.get("updated_at", raw["created_at"])),
        "metadata": json.loads(raw.get("metadata") or "{}"),
    }
    if raw.get("parent"):
        data["parent"] = json.loads(raw["parent"])
    if raw.get("result"):
        data["result"] = json.loads(raw["result"])
    if raw.get("max_active"):
        data["max_active"] = int(raw["max_active"])
    return RunRecord.model_validate(data)


def _stream_entries(reply: Any) -> list[tuple[Any, dict[Any, Any]]]:
    """Entries of a one-stream XREAD reply in RESP2 (list) or RESP3 (dict) shape."""
    if not reply:
        return []
    if isinstance(reply, dict):
        streams = list(reply.values())  # RESP3: {key: [entries]}
        entries = streams[0][0] if streams and streams[0] else []
    else:
        entries = reply[0][1]
    return [(entry_id, fields) for entry_id, fields in entries]


def _decode_event(fields: dict[Any, Any]) -> dict[str, Any]:
    data = {_text(k): _text(v) for k, v in fields.items()}.get("data")
    if data is None:
        return {"type": "invalid_event", "fields": {_text(k): _text(v) for k, v in fields.items()}}
    try:
        event = json.loads(data)
    except ValueError:
        return {"type": "invalid_event", "raw": data}
    return event if isinstance(event, dict) else {"type": "invalid_event", "raw": data}


__all__ = [
    "CompleteResult",
    "DEFAULT_MAX_EVENTS",
    "LeadRecovery",
    "SegmentStart",
    "RUN_ID_PATTERN",
    "RunKeys",
    "RunStore",
    "WorkItem",
    "check_run_id",
    "now_ms",
]
