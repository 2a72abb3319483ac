"""The worker side of ``bench/distributed.py``: the bench teams, the Celery no-op
baseline app and the instrumentation its worker processes install.

Worker processes import this module as their team (``distributed_teams:bench_team``,
``distributed_teams:bench_tool_team``) or their Celery app
(``distributed_teams:noop_app``). On import, in that order: with ``BENCH_COUNT_DIR``
set, every request the process writes to Redis is counted (and, with
``BENCH_TRACE``, traced) into that folder; with ``BENCH_STOCK_TRANSPORT`` set,
the worker's Celery app is configured with kombu's own Redis transport (this
runs before ``lattice worker`` builds its app, which it does after importing the
team); then the teams and the no-op app are built.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from celery import Celery

from lattice_client.settings import get_settings
from lattice_worker import AssistantModelMessage, ScriptedModelClient, define_agent, tool
from lattice_worker.team import create_team, team_member
from lattice_worker.team.reports import parse_report_message

REPO = Path(__file__).resolve().parent.parent
TEAM_REF = "distributed_teams:bench_team"
TOOL_TEAM_REF = "distributed_teams:bench_tool_team"
NOOP_APP_REF = "distributed_teams:noop_app"
NOOP_QUEUE_SUFFIX = "bench.noop"
CHAIN_QUEUE_SUFFIX = "bench.chain"
"""The first stock worker's queue of the Celery-only chain of (a) (its first and last hop)."""
CHAIN2_QUEUE_SUFFIX = "bench.chain2"
"""The second stock worker's queue (the chain's middle hop)."""
COUNT_DIR_ENV = "BENCH_COUNT_DIR"

# --------------------------------------------------------------------------- worker-side round-trip counting


def _install_counters(directory: str) -> None:
    """In a worker process: count every request written to Redis (one
    ``send_packed_command`` per command or pipeline) and dump the counts to
    ``<directory>/<pid>.json`` every 0.1 s."""
    import redis.asyncio.connection as aconn
    import redis.connection as sconn

    counts: dict[str, Any] = {"async": 0, "sync": 0, "trace": []}
    lock = threading.Lock()
    tracing = bool(os.environ.get("BENCH_TRACE"))

    scripts: dict[str, str] = {}  # SHA1 -> script name, for EVALSHA (filled on first use)

    def script_name(sha: str) -> str:
        if not scripts:
            import hashlib

            for folder in (REPO / "lattice_mailbox" / "lua", REPO / "lattice_client" / "runstore" / "lua"):
                for lua in folder.glob("*.lua"):
                    scripts[hashlib.sha1(lua.read_bytes()).hexdigest()] = lua.stem
        return scripts.get(sha, sha[:8])

    def names(packed: Any) -> str:
        # the command names of one request (a pipeline has several), a script call with its
        # script's name, for --trace
        data = b"".join(packed) if isinstance(packed, (list, tuple)) else bytes(packed)
        parts: list[str] = []
        pos = 0
        while pos < len(data) and data[pos : pos + 1] == b"*":  # RESP arrays of bulk strings
            end = data.index(b"\r\n", pos)
            args = []
            pos = end + 2
            for _ in range(int(data[1 + data.rfind(b"*", 0, end + 1) : end])):
                end = data.index(b"\r\n", pos)
                size = int(data[pos + 1 : end])
                args.append(data[end + 2 : end + 2 + size])
                pos = end + 4 + size
            part = args[0].decode().upper() if args else "?"
            if part == "EVAL" and len(args) > 1:
                found = re.match(rb"-- (\w+)\.lua", args[1])
                part += f"({found.group(1).decode() if found else '?'})"
            elif part == "EVALSHA" and len(args) > 1:
                part += f"({script_name(args[1].decode())})"
            parts.append(part)
        return "+".join(parts[:8]) + ("+..." if len(parts) > 8 else "")

    def note(kind: str, packed: Any) -> None:
        counts[kind] += 1
        if tracing:
            counts["trace"].append(
                f"{time.time():.6f} {kind}:{threading.current_thread().name}:{names(packed)}"
            )

    def wrap(cls: Any, kind: str, is_async: bool) -> None:
        original = cls.send_packed_command
        if is_async:

            async def counted(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
                note(kind, command)
                return await original(self, command, *args, **kwargs)
        else:

            def counted(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                with lock:
                    note(kind, command)
                return original(self, command, *args, **kwargs)

        cls.send_packed_command = counted

    wrap(aconn.AbstractConnection, "async", True)
    wrap(sconn.AbstractConnection, "sync", False)
    path = Path(directory) / f"{os.getpid()}.json"

    def dump() -> None:
        while True:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(counts))
            tmp.replace(path)
            time.sleep(0.1)

    threading.Thread(target=dump, daemon=True, name="bench-counters").start()


if os.environ.get(COUNT_DIR_ENV):
    _install_counters(os.environ[COUNT_DIR_ENV])

STOCK_TRANSPORT_ENV = "BENCH_STOCK_TRANSPORT"
"""Set in a bench worker: kombu's own Redis transport instead of
``lattice_client.kombu_redis`` (the ``stock-transport`` variant of (b)). The
worker imports this module (its team) before it builds its Celery app."""

if os.environ.get(STOCK_TRANSPORT_ENV):
    import lattice_client.celery_config as _celery_config

    _configured = _celery_config.celery_config

    def _stock_config(settings: Any) -> dict[str, Any]:
        config = _configured(settings)
        config.pop("broker_transport", None)
        return config

    _celery_config.celery_config = _stock_config

# --------------------------------------------------------------------------- the team (imported by the workers)


async def _latency() -> None:
    seconds = float(os.environ.get("BENCH_MODEL_LATENCY", "0") or 0)
    if seconds > 0:
        await asyncio.sleep(seconds)


def _tool_use(name: str, data: dict[str, Any], tid: str) -> AssistantModelMessage:
    return AssistantModelMessage(
        content=[{"type": "tool_use", "id": tid, "name": name, "input": data}], stop_reason="tool_use"
    )


async def lead_model(request: Any) -> AssistantModelMessage:
    """Hand the prompt to ``echo``; answer with its report."""
    await _latency()
    for message in reversed(request.messages):
        entries = parse_report_message(message)
        if entries:
            return AssistantModelMessage(
                content=[{"type": "text", "text": f"answer: {entries[0]['content']}"}], stop_reason="end_turn"
            )
    prompt = request.messages[0]["content"]
    return _tool_use("echo", {"mode": "handoff", "task": str(prompt)}, "toolu_handoff")


async def echo_model(request: Any) -> AssistantModelMessage:
    """Reply to the task at once (``team_reply`` ends the member's turn)."""
    await _latency()
    return _tool_use("team_reply", {"content": "echoed"}, "toolu_reply")


WORKSPACE_ENV = "BENCH_WORKSPACE"
"""Set in a bench worker: the bench team's agents get a workspace (the built-in
file, search and shell tools, as ``define_agent``'s default gives them) under the
worker's count folder, instead of ``workspace=False``."""


def _workspace() -> Any:
    if not os.environ.get(WORKSPACE_ENV):
        return False
    return str(Path(os.environ.get(COUNT_DIR_ENV) or ".") / "workspace")


bench_team = create_team(
    name="bench",
    lead=define_agent(
        name="lead", model_client=ScriptedModelClient(lead_model), max_turns=4, workspace=_workspace()
    ),
    members=[
        team_member(
            name="echo",
            agent=define_agent(
                name="echo", model_client=ScriptedModelClient(echo_model), workspace=_workspace()
            ),
        )
    ],
)


async def scribe_model(request: Any) -> AssistantModelMessage:
    """Call ``note`` once, then reply with its result."""
    await _latency()
    if len(request.messages) == 1:
        return _tool_use("note", {"text": "x"}, "toolu_note")
    return _tool_use("team_reply", {"content": "echoed"}, "toolu_reply")


@tool
def note(text: str) -> str:
    """Take a note (an unguarded tool: the journal records it)."""
    return f"noted {text}"


bench_tool_team = create_team(
    name="bench_tool",
    lead=define_agent(name="lead", model_client=ScriptedModelClient(lead_model), max_turns=4),
    members=[
        team_member(
            name="echo",
            agent=define_agent(name="scribe", model_client=ScriptedModelClient(scribe_model), tools=[note]),
        )
    ],
)

# --------------------------------------------------------------------------- the baseline (a Celery no-op)


STOCK_CONF_ENV = "BENCH_STOCK_CONF"
"""JSON object of Celery settings a stock worker of a chain variant of (a) adds
(``--chain-variants``); ``{"chain_results": true}`` stores every hop's result."""


def _stock_conf() -> dict[str, Any]:
    return dict(json.loads(os.environ.get(STOCK_CONF_ENV) or "{}"))


def make_noop_app() -> Celery:
    """A **stock** Celery app: ``Celery(name, broker, backend)`` on the bench's Redis,
    none of the project's configuration (its workers run with Celery's defaults and
    ``-E``), plus a chain variant's settings (:data:`STOCK_CONF_ENV`)."""
    url = os.environ.get("LATTICE_BROKER_URL") or get_settings().broker_url
    app = Celery("bench-noop", broker=url, backend=url)
    conf = _stock_conf()
    conf.pop("chain_results", None)
    app.conf.update(conf)
    return app


noop_app = make_noop_app()


@noop_app.task(name="bench.noop", shared=False)
def noop() -> str:
    return "ok"


@noop_app.task(name="bench.chain", ignore_result=not _stock_conf().get("chain_results"), shared=False)
def chain(hops: list[str], final_id: str) -> str:
    """One hop of the Celery chain floor: send the next hop to the next queue of
    ``hops`` (the last hop stores ``"ok"`` under ``final_id``)."""
    if len(hops) == 1:
        noop_app.send_task("bench.noop", queue=hops[0], task_id=final_id)
    else:
        noop_app.send_task("bench.chain", args=[hops[1:], final_id], queue=hops[0])
    return "sent"
