"""The live worker registry: which workers are alive, and the teams and queues they serve.

Every worker keeps one Redis key, ``<prefix>:worker:<node name>``, holding a
:class:`WorkerInfo` as JSON, set with an expiry of
:func:`heartbeat_ttl_seconds` (three heartbeats) and refreshed every
heartbeat by a thread of the worker (``lattice_worker.runtime.worker.heartbeat``);
the set ``<prefix>:workers`` indexes the node names. A worker that stops
deletes its key; one that dies stops refreshing it and Redis expires it;
after a Redis restart that lost the keys, the next heartbeat writes them
again. Readers (:func:`read_workers`) keep the keys that still exist and
drop the others from the index.

The client resolves team names and references through this registry only
(:class:`LiveRegistry`): it never imports a team's module.

Also here, because the client and the workers both check them: the bounds of
team names (:data:`TEAM_NAME_PATTERN`), team references
(:data:`TEAM_REF_PATTERN`) and client-chosen run ids (:func:`check_submitted_run_id`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from .runstore import check_run_id

TEAM_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""Team names: 1-64 characters of ``[A-Za-z0-9_.-]`` (as ``create_team`` enforces)."""

TEAM_REF_PATTERN = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
"""Team references: ``package.module:attribute`` (at most :data:`MAX_TEAM_REF_LENGTH` characters)."""

MAX_TEAM_REF_LENGTH = 200
"""Longest accepted team reference, in characters."""

RESERVED_RUN_ID_PREFIXES = ("child.",)
"""Run id namespaces the runtime uses itself (``child.<message id>``: a nested
team's child run); a submitted run id may not start with one."""

HEARTBEAT_TTL_BEATS = 3
"""A worker's registry key expires this many heartbeats after its last refresh."""


def check_team_name(name: Any) -> str:
    """Return ``name`` or raise ``ValueError`` unless it is 1-64 characters of ``[A-Za-z0-9_.-]``."""
    if not isinstance(name, str) or not TEAM_NAME_PATTERN.fullmatch(name):
        raise ValueError(f"invalid team name {name!r}: expected 1-64 characters of [A-Za-z0-9_.-]")
    return name


def check_team_ref(ref: Any) -> str:
    """Return ``ref`` or raise ``ValueError`` unless it is a ``package.module:attribute``
    reference of at most :data:`MAX_TEAM_REF_LENGTH` characters."""
    if not isinstance(ref, str) or len(ref) > MAX_TEAM_REF_LENGTH or not TEAM_REF_PATTERN.fullmatch(ref):
        shown = ref if not isinstance(ref, str) or len(ref) <= 80 else ref[:80] + "..."
        raise ValueError(
            f"invalid team reference {shown!r}: expected 'package.module:attribute' "
            f"(at most {MAX_TEAM_REF_LENGTH} characters)"
        )
    return ref


def check_submitted_run_id(run_id: Any) -> str:
    """Return ``run_id`` or raise ``ValueError``: a run id a caller chooses is
    1-128 characters of ``[A-Za-z0-9_.:-]`` and does not start with one of the
    runtime's own namespaces (:data:`RESERVED_RUN_ID_PREFIXES`)."""
    check_run_id(run_id)
    for reserved in RESERVED_RUN_ID_PREFIXES:
        if run_id.startswith(reserved):
            raise ValueError(
                f"invalid run id {run_id!r}: ids starting with {reserved!r} are the runtime's own "
                "(nested teams' child runs); choose another id"
            )
    return run_id


def workers_key(prefix: str) -> str:
    """The set of registered node names: ``<prefix>:workers``."""
    return f"{prefix}:workers"


def worker_key(prefix: str, node: str) -> str:
    """One worker's registry entry: ``<prefix>:worker:<node>``."""
    return f"{prefix}:worker:{node}"


def heartbeat_ttl_seconds(heartbeat_seconds: float) -> float:
    """How long (seconds) a worker's entry outlives its last heartbeat."""
    return HEARTBEAT_TTL_BEATS * heartbeat_seconds


class WorkerInfo(BaseModel):
    """What one live worker published.

    ``node``: the Celery node name (``lattice.<team>.<random>@<host>``).
    ``teams``: ``{reference or name it was started with -> team name}``, plus
    ``{name -> name}`` for every team it serves (nested teams included).
    ``mailboxes``: the member mailbox ids (``team::member``) of the teams it
    serves, nested ones included (whether or not this worker consumes their
    queues). ``queues``: the Celery queues it consumes. ``pool`` / ``concurrency``:
    its Celery pool (``threads``, ``prefork``...) and pool size.
    ``heartbeat_seconds``: its heartbeat interval. ``started_at_ms`` /
    ``seen_at_ms``: Unix times in milliseconds of its start and last heartbeat
    (the worker's clock).
    """

    node: str
    hostname: str = ""
    pid: int = 0
    teams: dict[str, str] = Field(default_factory=dict)
    mailboxes: list[str] = Field(default_factory=list)
    queues: list[str] = Field(default_factory=list)
    pool: str = ""
    concurrency: int = 0
    heartbeat_seconds: float = 0.0
    started_at_ms: int = 0
    seen_at_ms: int = 0

    def team_names(self) -> set[str]:
        """The names of the teams this worker serves."""
        return set(self.teams.values())


class LiveRegistry:
    """A snapshot of the live workers (:func:`read_workers`), to resolve teams and group queues."""

    def __init__(self, workers: Iterable[WorkerInfo]) -> None:
        self.workers = sorted(workers, key=lambda w: w.node)

    def resolve(self, team: str, lead_queue: Callable[[str], str] | None = None) -> str | None:
        """The team name a live worker published for the name or reference
        ``team``, or ``None`` when no live worker did. With ``lead_queue``
        (team name -> its lead queue) the name counts only while some live
        worker -- the same or another -- consumes that queue: one that can
        start the team's runs."""
        for worker in self.workers:
            name = worker.teams.get(team)
            if name is not None and (lead_queue is None or self.consumes(lead_queue(name))):
                return name
        return None

    def mailbox_ids(self) -> list[str]:
        """The member mailbox ids some live worker's teams have, sorted."""
        return sorted({box for worker in self.workers for box in worker.mailboxes})

    def consumes(self, queue: str) -> bool:
        """Whether some live worker consumes ``queue``."""
        return any(queue in worker.queues for worker in self.workers)

    def mapping(self) -> dict[str, str]:
        """Every ``{reference or name -> team name}`` a live worker published."""
        out: dict[str, str] = {}
        for worker in self.workers:
            out.update(worker.teams)
        return out

    def team_names(self) -> list[str]:
        """The names of the teams some live worker serves, sorted."""
        return sorted({name for worker in self.workers for name in worker.team_names()})

    def by_queue(self, queue_prefix: str | None = None) -> dict[str, list[WorkerInfo]]:
        """``{queue -> the live workers consuming it}``, queues sorted; only
        queues starting with ``queue_prefix`` when given."""
        out: dict[str, list[WorkerInfo]] = {}
        for worker in self.workers:
            for queue in worker.queues:
                if queue_prefix is None or queue.startswith(queue_prefix):
                    out.setdefault(queue, []).append(worker)
        return dict(sorted(out.items()))


def encode_worker(info: WorkerInfo) -> str:
    """The JSON stored in a worker's registry key."""
    return info.model_dump_json()


def publish_commands(prefix: str, info: WorkerInfo, ttl_seconds: float) -> list[tuple[Any, ...]]:
    """The commands of one heartbeat: ``SET <worker key> <json> PX <ttl>`` and
    ``SADD <prefix>:workers <node>`` (as ``(method, *args, kwargs)`` tuples for a pipeline)."""
    return [
        ("set", worker_key(prefix, info.node), encode_worker(info), {"px": max(1, int(ttl_seconds * 1000))}),
        ("sadd", workers_key(prefix), info.node, {}),
    ]


def publish_blocking(client: Any, prefix: str, info: WorkerInfo, ttl_seconds: float) -> None:
    """Write one heartbeat with the blocking redis-py ``client`` (one round trip)."""
    with client.pipeline(transaction=False) as pipe:
        for method, *args, kwargs in publish_commands(prefix, info, ttl_seconds):
            getattr(pipe, method)(*args, **kwargs)
        pipe.execute()


def unpublish_blocking(client: Any, prefix: str, node: str) -> None:
    """Remove a worker's entry (a warm shutdown)."""
    with client.pipeline(transaction=False) as pipe:
        pipe.delete(worker_key(prefix, node))
        pipe.srem(workers_key(prefix), node)
        pipe.execute()


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _decode(nodes: list[str], values: list[Any]) -> tuple[list[WorkerInfo], list[str]]:
    # (the live workers, the index entries whose key is gone)
    live: list[WorkerInfo] = []
    gone: list[str] = []
    for node, raw in zip(nodes, values, strict=True):
        if raw is None:
            gone.append(node)
            continue
        try:
            live.append(WorkerInfo.model_validate_json(raw))
        except ValidationError:
            gone.append(node)  # not ours: ignored (and dropped from the index)
    return live, gone


async def read_workers(client: Any, prefix: str) -> list[WorkerInfo]:
    """The live workers of ``prefix``, read with the ``redis.asyncio`` ``client``
    (two round trips: the index, then a pipeline of one ``GET`` per worker, which
    a Redis Cluster client splits by slot; a third drops index entries whose key expired)."""
    nodes = sorted(_text(n) for n in await client.smembers(workers_key(prefix)))
    if not nodes:
        return []
    async with client.pipeline(transaction=False) as pipe:
        for n in nodes:  # one GET per key, not an MGET: on a Redis Cluster the keys lie in many slots
            pipe.get(worker_key(prefix, n))
        values = await pipe.execute()
    live, gone = _decode(nodes, values)
    if gone:
        await client.srem(workers_key(prefix), *gone)
    return live


def read_workers_blocking(client: Any, prefix: str) -> list[WorkerInfo]:
    """:func:`read_workers` with a blocking redis-py ``client``."""
    nodes = sorted(_text(n) for n in client.smembers(workers_key(prefix)))
    if not nodes:
        return []
    with client.pipeline(transaction=False) as pipe:
        for n in nodes:
            pipe.get(worker_key(prefix, n))
        values = pipe.execute()
    live, gone = _decode(nodes, values)
    if gone:
        client.srem(workers_key(prefix), *gone)
    return live


def now_ms() -> int:
    """Unix time in milliseconds."""
    return time.time_ns() // 1_000_000


__all__ = [
    "HEARTBEAT_TTL_BEATS",
    "LiveRegistry",
    "MAX_TEAM_REF_LENGTH",
    "RESERVED_RUN_ID_PREFIXES",
    "TEAM_NAME_PATTERN",
    "TEAM_REF_PATTERN",
    "WorkerInfo",
    "check_submitted_run_id",
    "check_team_name",
    "check_team_ref",
    "encode_worker",
    "heartbeat_ttl_seconds",
    "now_ms",
    "publish_blocking",
    "publish_commands",
    "read_workers",
    "read_workers_blocking",
    "unpublish_blocking",
    "worker_key",
    "workers_key",
]
