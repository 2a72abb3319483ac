"""The run store: run records, per-run work-item wait sets and event streams in Redis.

Every multi-key operation is one Lua script from
``lattice_client/runstore/lua/`` (one file per operation; each lists its KEYS, ARGV,
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
``R:tools``            hash    the lead's own tool journal (see :mod:`.tool_calls`)
``R:waits``            hash    the run's waits for a person: parked calls, approvals
``R:item:<id>:*``      ...     a work item's tool journal and member history
``P:runs:waiting``     zset    runs that have had a wait (listing index)
``P:runs``             zset    run ids by creation time (ms)
``P:runs:team:<team>`` zset    the same, per team
``P:runs:leased``      zset    run ids of running lead segments by ``lease_until`` (ms)
=====================  ======  ===============================================

Lead leases (``docs/architecture.md``, "Crash"): while a lead segment runs, the run
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

Modules: :mod:`.records` (the data types and reply parsing), :mod:`.scripts`
(the Lua scripts), :mod:`.core` (connections, keys, script calls), then one
module per area: :mod:`.run_records` (create, status, list, delete),
:mod:`.items` (work items and the wait set), :mod:`.segments` (lead segments
and their leases), :mod:`.journal` (the call journal and fenced history
writes), :mod:`.events` (event streams, results, finish, cancel),
:mod:`.tool_calls` (the tool journals, work-item histories and waits of
crash-safe tool calls: ``docs/tool-effects.md``).
:class:`RunStore` (:mod:`.store`) is the one public entry point.
"""

from .records import (
    DEFAULT_MAX_EVENTS,
    RUN_ID_PATTERN,
    CompleteResult,
    EventFence,
    LeadRecovery,
    RunKeys,
    SegmentStart,
    WorkItem,
    check_block_ms,
    check_run_id,
    dumps,
    final_from_reply,
    now_ms,
    result_from_reply,
)
from .store import RunStore
from .tool_calls import WaitStateError

__all__ = [
    "CompleteResult",
    "DEFAULT_MAX_EVENTS",
    "EventFence",
    "LeadRecovery",
    "RUN_ID_PATTERN",
    "RunKeys",
    "RunStore",
    "SegmentStart",
    "WaitStateError",
    "WorkItem",
    "check_block_ms",
    "check_run_id",
    "dumps",
    "final_from_reply",
    "now_ms",
    "result_from_reply",
]
