"""The one connection policy of every Redis client the product makes (redis-py, sync and asyncio).

Redis, a proxy or a managed service closes idle client connections (the
server's ``timeout`` setting, ``CLIENT KILL``, a failover). A command sent on
such a connection fails, and whether it took effect is then unknown. The
clients built here therefore:

* **find a dead connection before sending on it.** A connection taken from the
  pool whose socket is readable while idle (the server's close: end of file or
  reset) is replaced first: redis-py's blocking pool polls the socket itself;
  for asyncio connections the policy polls it (redis-py's own asyncio check
  sees only what the event loop has read, and is skipped altogether while
  maintenance notifications are ``"auto"`` -- they are turned off here: they
  need RESP3, which we do not use). A connection idle for more than
  :data:`HEALTH_CHECK_INTERVAL_SECONDS` is checked with a ``PING`` before the
  command goes; when the ``PING`` fails,
  the connection is replaced and the command goes on the new one (nothing of
  it was sent).
* **retry connecting** (:data:`CONNECT_RETRIES` times, exponential backoff
  from 0.1 s capped at 0.5 s, about 2.2 s in all): a connect or handshake that
  failed sent no command; then :class:`UnreachableError` (a
  ``ConnectionError``) or the ``TimeoutError``. Wrong credentials
  (``AuthenticationError``) are not retried.
* **never resend a command** (redis-py's command retry is off): a command that
  was sent and got no reply raises ``redis.exceptions.ConnectionError`` /
  ``TimeoutError``, and the caller's claim and lease tokens decide what
  happened (see docs/contracts.md, "Connections").
* **TCP keepalive** on TCP connections (probes after :data:`KEEPALIVE_IDLE_SECONDS`
  idle where the platform lets us set it) and a connect timeout of
  :data:`CONNECT_TIMEOUT_SECONDS`; the per-command ``socket_timeout`` stays the
  caller's (blocking reads such as ``XREAD BLOCK`` need none).

The asyncio socket poll reads redis-py's private ``Connection._writer`` (the
one place below redis-py's public API): the public alternative, a ``PING``
before every command, costs a round trip each (``bench/connections.py``: the
poll adds about 1% to a ``GET``, a ``PING`` first about 90%);
``test_a_connection_killed_while_its_loop_was_not_running_is_replaced`` pins it.

:func:`async_redis` and :func:`sync_redis` build the clients; every keyword a
caller gives wins over the policy's. A *read* whose connection was lost while it
waited (an ``XREAD BLOCK`` when the server closed the connection) has no effect,
so :func:`read_again` / :func:`read_again_blocking` send it again.
``tests/integration/test_connections.py`` pins the redis-py behaviour this
relies on.
"""

from __future__ import annotations

import asyncio
import select
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ClusterError,
    RedisClusterUnreachableError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.maint_notifications import MaintNotificationsConfig
from redis.retry import Retry as SyncRetry

T = TypeVar("T")

HEALTH_CHECK_INTERVAL_SECONDS = 1.0
"""A connection idle longer than this (seconds) is ``PING``-ed before its next command."""

CONNECT_RETRIES = 6
"""How many times a failed connect (or connect handshake) is tried again."""

CONNECT_TIMEOUT_SECONDS = 5.0
"""How long (seconds) one connect attempt may take."""

KEEPALIVE_IDLE_SECONDS = 30
"""Idle seconds before the first TCP keepalive probe (then every 10 s, 3 probes)."""

_NOT_RETRIED = (AuthenticationError, AuthorizationError)
_FAILED = (RedisConnectionError, RedisTimeoutError, OSError)


def _backoff_seconds(failures: int) -> float:
    return ExponentialBackoff(cap=0.5, base=0.05).compute(failures)


def keepalive_options() -> dict[int, int]:
    """The TCP keepalive socket options (``{socket.TCP_KEEPIDLE: 30, ...}``) this platform lets us set."""
    options: dict[int, int] = {}
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_SECONDS), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            options[getattr(socket, name)] = value
    return options


def _closed_by_peer(writer: Any) -> bool:
    """Whether the socket under an idle asyncio connection is readable now: the
    peer closed it (end of file, reset) or sent what nobody asked for. One
    zero-timeout ``poll``; ``True`` when the socket cannot be polled."""
    sock = writer.get_extra_info("socket") if writer is not None else None
    if sock is None:
        return False
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        return bool(select.select([sock.fileno()], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def _connect_backoff(exc: BaseException, failures: int) -> float:
    """Seconds to wait before connect attempt ``failures + 1`` after ``exc``; past
    :data:`CONNECT_RETRIES` raises ``exc`` (a timeout) or :class:`UnreachableError`."""
    if failures <= CONNECT_RETRIES:
        return _backoff_seconds(failures)
    if isinstance(exc, (RedisTimeoutError, UnreachableError)):
        raise exc
    raise UnreachableError(str(exc)) from exc


class _AsyncPolicy:
    """Mixed into redis-py's asyncio connection classes (see the module doc)."""

    async def connect(self) -> None:
        # The pool calls this on every connection it hands out. An asyncio stream
        # learns of the server's close only when its loop next reads the socket;
        # a loop that was not running meanwhile (a worker between two tasks) or
        # busy has not, so the socket itself is asked (redis-py's blocking pool
        # polls it the same way).
        if self.is_connected and _closed_by_peer(getattr(self, "_writer", None)):  # type: ignore[attr-defined]
            await self.disconnect()  # type: ignore[attr-defined]
        return await super().connect()  # type: ignore[misc]

    async def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        # where redis-py connects (``connect`` calls it; a cluster pipeline calls it directly)
        failures = 0
        while True:
            try:
                return await super().connect_check_health(*args, **kwargs)  # type: ignore[misc]
            except _NOT_RETRIED:
                raise
            except _FAILED as exc:
                failures += 1
                await asyncio.sleep(_connect_backoff(exc, failures))

    async def check_health(self) -> None:
        try:
            await super().check_health()  # type: ignore[misc]
        except _NOT_RETRIED:
            raise
        except _FAILED:  # the PING failed (nothing of the command went): a new connection
            await self.disconnect()  # type: ignore[attr-defined]
            await self.connect()


class _SyncPolicy:
    """Mixed into redis-py's blocking connection classes (see the module doc)."""

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        # where redis-py connects (``connect`` calls it, and so does a command sent unconnected)
        failures = 0
        while True:
            try:
                return super().connect_check_health(*args, **kwargs)  # type: ignore[misc]
            except _NOT_RETRIED:
                raise
            except _FAILED as exc:
                failures += 1
                time.sleep(_connect_backoff(exc, failures))

    def check_health(self) -> None:
        try:
            super().check_health()  # type: ignore[misc]
        except _NOT_RETRIED:
            raise
        except _FAILED:
            self.disconnect()  # type: ignore[attr-defined]
            self.connect()


_CLASSES: dict[type, type] = {}


def _with_policy(base: type, mixin: type) -> type:
    """``base`` (a redis-py connection class) with ``mixin`` in front, made once."""
    if issubclass(base, mixin):
        return base
    found = _CLASSES.get(base)
    if found is None:
        found = _CLASSES[base] = type(f"Lattice{base.__name__}", (mixin, base), {})
    return found


def policy_options(url: str, *, asyncio_client: bool) -> dict[str, Any]:
    """The keyword arguments the policy gives ``ConnectionPool.from_url(url, ...)``
    (no command resend, health checks, connect timeout, keepalive on TCP)."""
    options: dict[str, Any] = {
        "retry": AsyncRetry(NoBackoff(), 0) if asyncio_client else SyncRetry(NoBackoff(), 0),
        "health_check_interval": HEALTH_CHECK_INTERVAL_SECONDS,
        "socket_connect_timeout": CONNECT_TIMEOUT_SECONDS,
        "maint_notifications_config": MaintNotificationsConfig(enabled=False),
    }
    if not url.lower().startswith("unix:"):
        options["socket_keepalive"] = True
        options["socket_keepalive_options"] = keepalive_options()
    return options


class UnreachableError(RedisConnectionError):
    """No connection could be made to the server (after the connect retries): the
    ``redis.exceptions.ConnectionError`` the policy's connect raises then."""


READ_AGAIN_FAST_LOSSES = 20
"""How many times in a row a read may lose its connection at once (within
0.05 s: a server that accepts and drops) before :func:`read_again` gives up."""


def _fast_losses(exc: BaseException, fast: int, started: float) -> int:
    """The count of immediate losses in a row after a read that started at
    ``started`` lost ``exc``; raises ``exc`` at the :data:`READ_AGAIN_FAST_LOSSES`-th."""
    fast = fast + 1 if time.monotonic() - started < 0.05 else 0
    if fast >= READ_AGAIN_FAST_LOSSES:
        raise exc
    return fast


async def read_again(read: Callable[[], Awaitable[T]]) -> T:
    """``await read()``; when its connection is lost mid-call (``ConnectionError``:
    the server closed it while the read waited, e.g. an ``XREAD BLOCK``), call it
    again on a new connection, as long as connecting works: :class:`UnreachableError`
    (the server cannot be reached) is raised, and so is the
    :data:`READ_AGAIN_FAST_LOSSES`-th immediate loss in a row. Only for reads: a
    read has no effect, so sending it again is safe."""
    fast = 0
    while True:
        started = time.monotonic()
        try:
            return await read()
        except (UnreachableError, *_NOT_RETRIED):
            raise
        except RedisConnectionError as exc:
            fast = _fast_losses(exc, fast, started)
            if fast:
                await asyncio.sleep(0.05)


def read_again_blocking(read: Callable[[], T]) -> T:
    """:func:`read_again` for a blocking client's read."""
    fast = 0
    while True:
        started = time.monotonic()
        try:
            return read()
        except (UnreachableError, *_NOT_RETRIED):
            raise
        except RedisConnectionError as exc:
            fast = _fast_losses(exc, fast, started)
            if fast:
                time.sleep(0.05)


CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
"""URL schemes naming a Redis Cluster: ``redis+cluster://[user:password@]host:port[,host:port...]``
(``rediss+cluster://`` for TLS)."""

CLUSTER_RETRY_SECONDS = 30.0
"""How long (seconds) a command sent to a Redis Cluster is tried again while the
cluster says it did not run it (``CLUSTERDOWN``, ``TRYAGAIN``, a slot without a
master, no node reachable): long enough for a failover with the server's default
``cluster-node-timeout`` of 15 s."""

_CLUSTER_NOT_RUN = (
    ClusterError,
    TryAgainError,
    SlotNotCoveredError,
    RedisClusterUnreachableError,
    UnreachableError,
)
"""Errors of a cluster command that mean it did not run: the server refused it
(``CLUSTERDOWN``, ``TRYAGAIN``, a redirect loop), no node owned its slot, or no
connection could be made (nothing was sent)."""


def _cluster_did_not_run(exc: BaseException) -> bool:
    """Whether a cluster command that raised ``exc`` certainly did not run. redis-py
    raises a lost reply (a ``ConnectionError``) as ``RedisClusterUnreachableError``
    while no node answers its topology refresh: that one may have run."""
    if isinstance(exc, RedisClusterUnreachableError):
        cause = exc.__cause__
        return cause is None or isinstance(cause, _CLUSTER_NOT_RUN)
    return isinstance(exc, _CLUSTER_NOT_RUN)


def is_cluster_url(url: object) -> bool:
    """Whether ``url`` is a Redis Cluster URL (:data:`CLUSTER_SCHEMES`)."""
    return isinstance(url, str) and url.partition("://")[0].lower() in CLUSTER_SCHEMES


def cluster_nodes(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """``([(host, port), ...], {"username": ..., "password": ..., "ssl": ...})`` of a
    cluster URL ``redis+cluster://[user[:password]@]host:port[,host:port...][/0]``.
    Raises ``ValueError`` (the URL shown without its password) for a node without
    a port, a database other than 0 (a cluster has only database 0) or a query string."""
    from urllib.parse import unquote

    from .urls import mask_url

    scheme, _, rest = url.partition("://")
    if scheme.lower() not in CLUSTER_SCHEMES:
        raise ValueError(
            f"not a Redis Cluster URL ({', '.join(s + '://' for s in CLUSTER_SCHEMES)}): {mask_url(url)!r}"
        )
    if "?" in rest:
        raise ValueError(f"a Redis Cluster URL takes no query string: {mask_url(url)!r}")
    rest, _, path = rest.partition("/")
    if path.strip("/") not in ("", "0"):
        raise ValueError(f"a Redis Cluster has only database 0, got /{path} in {mask_url(url)!r}")
    userinfo, _, hosts = rest.rpartition("@")
    options: dict[str, Any] = {"ssl": scheme.lower() == "rediss+cluster"}
    if userinfo:
        user, _, password = userinfo.partition(":")
        if user:
            options["username"] = unquote(user)
        if password:
            options["password"] = unquote(password)
    nodes = []
    for node in hosts.split(","):
        host, _, port = node.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"every node of a Redis Cluster URL needs host:port, got {node!r} in {mask_url(url)!r}"
            )
        nodes.append((host.strip("[]"), int(port)))
    return nodes, options


def _cluster_options(
    url: str, asyncio_client: bool, kwargs: dict[str, Any]
) -> tuple[list[tuple[str, int]], bool, dict[str, Any]]:
    """``(nodes, tls, keyword arguments of the cluster client)`` for a cluster URL."""
    nodes, options = cluster_nodes(url)
    tls = options.pop("ssl")
    options.update(policy_options("redis://", asyncio_client=asyncio_client))
    del options["retry"]  # a cluster client takes its retry as its own argument
    if tls:
        options["ssl"] = True
    options.update(kwargs)
    return nodes, tls, options


class _ClusterRetry:
    """Mixed into redis-py's cluster clients: a command the cluster did not run
    (:data:`_CLUSTER_NOT_RUN`) is sent again, with backoff, for up to
    :data:`CLUSTER_RETRY_SECONDS`; redis-py's own retry is off (it would also
    resend a command whose reply was lost, which may have run). MOVED and ASK
    redirects are followed by redis-py itself. Pipelines are not retried here:
    their callers decide, as on one Redis."""


class _AsyncLatticeCluster(_ClusterRetry, AsyncRedisCluster):
    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        started, failures = time.monotonic(), 0
        while True:
            try:
                return await super().execute_command(*args, **kwargs)
            except _CLUSTER_NOT_RUN as exc:
                failures += 1
                if not _cluster_did_not_run(exc) or time.monotonic() - started > CLUSTER_RETRY_SECONDS:
                    raise
                await asyncio.sleep(_cluster_backoff(failures))


class _SyncLatticeCluster(_ClusterRetry, RedisCluster):
    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        started, failures = time.monotonic(), 0
        while True:
            try:
                return super().execute_command(*args, **kwargs)
            except _CLUSTER_NOT_RUN as exc:
                failures += 1
                if not _cluster_did_not_run(exc) or time.monotonic() - started > CLUSTER_RETRY_SECONDS:
                    raise
                time.sleep(_cluster_backoff(failures))


def _cluster_backoff(failures: int) -> float:
    return ExponentialBackoff(cap=1.0, base=0.05).compute(failures)


def async_cluster(url: str, **kwargs: Any) -> AsyncRedisCluster:
    """A ``redis.asyncio.cluster.RedisCluster`` on the cluster URL ``url`` (see
    :func:`cluster_nodes`) with the connection policy on every node connection,
    MOVED/ASK followed, and a command the cluster did not run sent again for up
    to :data:`CLUSTER_RETRY_SECONDS`; no command whose reply was lost is resent.
    ``kwargs`` go to redis-py. Raises ``ValueError`` for a bad URL."""
    nodes, tls, options = _cluster_options(url, True, kwargs)
    policy_class = _with_policy(aioredis.SSLConnection if tls else aioredis.Connection, _AsyncPolicy)
    startup = [AsyncClusterNode(host, port, connection_class=policy_class) for host, port in nodes]
    client = _AsyncLatticeCluster(startup_nodes=startup, retry=AsyncRetry(NoBackoff(), 0), **options)
    # redis-py's asyncio cluster takes no connection class: the nodes it finds are built
    # from its (public) connection_kwargs, which its nodes manager shares
    client.connection_kwargs["connection_class"] = policy_class
    return client


def sync_cluster(url: str, **kwargs: Any) -> RedisCluster:
    """:func:`async_cluster` for a blocking ``redis.cluster.RedisCluster`` (thread-safe)."""
    nodes, tls, options = _cluster_options(url, False, kwargs)
    options["connection_class"] = _with_policy(redis.SSLConnection if tls else redis.Connection, _SyncPolicy)
    startup = [ClusterNode(host, port) for host, port in nodes]
    return _SyncLatticeCluster(startup_nodes=startup, retry=SyncRetry(NoBackoff(), 0), **options)


ASYNC_POOL_OPTIONS: dict[str, Any] = {"max_connections": 100, "timeout": 30.0}
"""The connection pool of an :func:`async_redis` client: at most ``max_connections``
connections (redis-py's default count); a command that finds them all in use
waits for one, up to ``timeout`` seconds (then ``redis.exceptions.ConnectionError``
"No connection available.", nothing sent), in redis-py's ``BlockingConnectionPool``.
redis-py's default asyncio pool raises ``MaxConnectionsError`` at once instead: with
1,000 steps in flight on one asyncio pool process, hundreds of steps failed and were
retried by Celery each run (``bench/distributed.py`` (b)). Waiting costs about 8 us
of CPU per command more than the default pool (50 concurrent ``GET``s)."""


def async_redis(url: str, **kwargs: Any) -> aioredis.Redis:
    """A ``redis.asyncio.Redis`` on ``url`` (``redis://``, ``rediss://``, ``unix://``)
    with the connection policy (module doc); ``kwargs`` (``decode_responses``,
    ``socket_timeout``, ``client_name``...) go to redis-py and win over the policy's.
    A cluster URL (``redis+cluster://h:p[,h:p...]``) gives a
    ``redis.asyncio.cluster.RedisCluster`` instead (:mod:`lattice_mailbox.cluster`;
    typed as ``Redis`` here: it answers the same commands, on keys of one slot).
    Must be used on one event loop only (redis-py's rule). Raises ``ValueError``
    for a URL redis-py cannot parse."""
    if is_cluster_url(url):
        return async_cluster(url, **kwargs)  # type: ignore[return-value]
    options = policy_options(url, asyncio_client=True)
    options.update(ASYNC_POOL_OPTIONS)
    options.update(kwargs)
    pool = aioredis.BlockingConnectionPool.from_url(url, **options)
    pool.connection_class = _with_policy(pool.connection_class, _AsyncPolicy)
    client = aioredis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # aclose() closes the pool (as Redis.from_url does)
    return client


def sync_redis(url: str, **kwargs: Any) -> redis.Redis:
    """A blocking ``redis.Redis`` on ``url`` with the connection policy; as
    :func:`async_redis` otherwise (thread-safe like any redis-py client); a
    cluster URL gives a ``redis.cluster.RedisCluster``."""
    if is_cluster_url(url):
        return sync_cluster(url, **kwargs)  # type: ignore[return-value]
    options = policy_options(url, asyncio_client=False)
    options.update(kwargs)
    pool = redis.ConnectionPool.from_url(url, **options)
    pool.connection_class = _with_policy(pool.connection_class, _SyncPolicy)
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True
    return client


__all__ = [
    "ASYNC_POOL_OPTIONS",
    "CLUSTER_RETRY_SECONDS",
    "CLUSTER_SCHEMES",
    "CONNECT_RETRIES",
    "CONNECT_TIMEOUT_SECONDS",
    "HEALTH_CHECK_INTERVAL_SECONDS",
    "KEEPALIVE_IDLE_SECONDS",
    "READ_AGAIN_FAST_LOSSES",
    "UnreachableError",
    "async_cluster",
    "async_redis",
    "cluster_nodes",
    "is_cluster_url",
    "keepalive_options",
    "policy_options",
    "read_again",
    "read_again_blocking",
    "sync_cluster",
    "sync_redis",
]
