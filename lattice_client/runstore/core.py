"""The run store's shared core: connections (one client per event loop), keys, script calls."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from lattice_mailbox.connections import async_redis

from ..errors import RunLeaseLostError, RunNotFoundError
from ..models import RunStatus
from ..settings import KEY_PREFIX_PATTERN
from .records import DEFAULT_MAX_EVENTS, RunKeys, as_text, check_run_id, now_ms
from .scripts import SCRIPTS, script_call


@dataclass
@dataclass
class _Conn:
    client: Redis
    scripts: dict[str, AsyncScript]


class RunStoreCore:
    """What every part of the run store shares: connections, keys, script calls
    (arguments: see :class:`~lattice_client.runstore.RunStore`)."""

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
        elif isinstance(redis_url_or_client, (Redis, RedisCluster)):
            self._shared = self._make_conn(redis_url_or_client)  # type: ignore[arg-type]
        else:
            raise TypeError(
                "RunStore needs a redis:// (or redis+cluster://) URL or a redis.asyncio.Redis "
                "(or redis.asyncio.cluster.RedisCluster) client"
            )
        self._keys: dict[str, RunKeys] = {}  # immutable, asked for on every call
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Conn] = (
            weakref.WeakKeyDictionary()
        )

    # -- connection ---------------------------------------------------------------------------

    @staticmethod
    def _make_conn(client: Redis) -> _Conn:
        return _Conn(client, {name: client.register_script(src) for name, src in SCRIPTS.items()})

    def _conn(self) -> _Conn:
        if self._shared is not None:
            return self._shared
        loop = asyncio.get_running_loop()
        conn = self._per_loop.get(loop)
        if conn is None:
            assert self._url is not None
            conn = self._make_conn(async_redis(self._url, decode_responses=True))
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
        return script_call(name, keys, args)

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

    @property
    def waiting_index_key(self) -> str:
        """The sorted set of run ids that have (or had) a wait -- a parked call,
        an approval, work parked at the budget -- by time (ms): the listing index."""
        return f"{self.prefix}:runs:waiting"

    def index_wait_command(self, run_id: str) -> tuple[Any, ...]:
        """The command adding ``run_id`` to the listing index (goes with a park)."""
        return ("zadd", self.waiting_index_key, {run_id: now_ms()})

    def team_index_key(self, team: str) -> str:
        """The sorted set of one team's run ids by creation time (ms)."""
        return f"{self.prefix}:runs:team:{team}"

    def result_key(self, run_id: str) -> str:
        """The run's result stream ``R:result``: only its ``run_result`` event,
        appended (field ``data``) by the same script call that appends it to
        ``R:events`` (:meth:`finish`, :meth:`cancel`, :meth:`recover_lead`), so
        a waiter wakes once. Runs finished before this stream existed have none."""
        return f"{self.keys(run_id).record}:result"

    async def reindex_lease(self, run_id: str) -> None:
        """Put a running run's lead lease back in the lease index (after a
        removal that turned out not to be the caller's to make: its ``finish``
        was refused, another segment holds the run)."""
        client = self._conn().client
        status, until = await client.hmget(self.keys(run_id).record, ["status", "lease_until"])
        if status is not None and as_text(status) == RunStatus.RUNNING.value and until:
            await client.zadd(self.leases_key, {run_id: int(as_text(until))}, gt=True)

    async def _unindex_lease(self, run_id: str) -> None:
        try:
            await self._conn().client.zrem(self.leases_key, run_id)
        except Exception:  # the reaper drops entries of runs that are not running
            pass


__all__ = ["RunStoreCore"]
