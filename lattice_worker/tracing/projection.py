"""Project the flat trace-event stream onto a tree of runs, for tracers whose
backend thinks in runs / spans / observations (LangSmith, Langfuse, OpenTelemetry).

One agent query is a ``chain`` run (``run_start`` .. ``result``); inside it each
model call is an ``llm`` run (``model_request`` .. ``assistant_message``) and
each tool call a ``tool`` run (``tool_use`` .. ``tool_result``). A chain whose
``parent_run_id`` names another chain this tracer has seen is its child (a team's
lead and members under the team's root run); a chain whose parent lives in
another process continues from the envelope's ``remote_parent`` headers. Other
events (``team_message``, ``team_agent``, injected user messages) become events
on their chain.

Runs always end children first: a ``result`` that arrives while a model call or
a tool call of its run is still open (a model error, an abort mid-batch) ends
those with the run's error before the chain itself; a chain that ends while
child chains are still open ends them too. Start and end times are the events'
own ``timestamp`` values.

A :class:`TraceBackend` turns :class:`RunStart` / :class:`RunEnd` into backend
calls; :class:`ProjectedContextTracer` is the ``ContextTracer`` every backend
shares (``seq`` handling, ``fail_on_error``, ``flush`` / ``close``).
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from ..errors import MissingExtraError
from .base import SeqCounter

logger = logging.getLogger("lattice_worker.tracing")

RunKind = Literal["chain", "llm", "tool"]

CLOSED_BEFORE_END = "the tracer was closed before this run ended"
_RECENT_CHAINS = 1024  # ended chains kept so that late children still find their parent


@dataclass
class RunStart:
    """What a backend needs to open one run.

    ``parent`` is the backend handle of the parent run (``None`` for a root);
    ``remote_parent`` the propagation headers of a parent traced in another
    process (only for a chain without a local parent). ``start_time`` is UTC.
    ``source`` is the event's ``source`` dict; ``inputs`` / ``metadata`` are
    JSON-ready dicts.
    """

    kind: RunKind
    name: str
    run_id: str
    session_id: str | None
    source: dict[str, Any]
    start_time: datetime
    inputs: dict[str, Any]
    metadata: dict[str, Any]
    parent: Any = None
    remote_parent: dict[str, str] | None = None
    model: str | None = None
    max_tokens: int | None = None
    tool_name: str | None = None
    tool_use_id: str | None = None
    tool_description: str | None = None

    @property
    def is_team_root(self) -> bool:
        return self.kind == "chain" and self.source.get("kind") == "team"


@dataclass
class RunEnd:
    """How one run ended. ``error`` is ``None`` on success; ``usage`` an
    Anthropic usage dict (``input_tokens``, ``output_tokens``,
    ``cache_read_input_tokens``, ``cache_creation_input_tokens``)."""

    end_time: datetime
    outputs: dict[str, Any] | None = None
    error: str | None = None
    error_type: str | None = None
    usage: dict[str, int] | None = None
    response_model: str | None = None
    response_id: str | None = None
    finish_reasons: list[str] | None = None


class TraceBackend(Protocol):
    """The per-backend half of a projected tracer. Every method is synchronous
    and must not block on the network (backends batch in the background)."""

    def start_run(self, start: RunStart) -> Any: ...

    def set_chain_input(self, handle: Any, message: dict[str, Any]) -> None: ...

    def end_run(self, handle: Any, start: RunStart, end: RunEnd) -> None: ...

    def add_event(self, handle: Any, name: str, data: dict[str, Any], time: datetime) -> None: ...

    def carrier(self, handle: Any) -> dict[str, str]: ...

    def flush(self) -> None: ...


@dataclass
class _Open:
    start: RunStart
    handle: Any
    parent: _Open | None = None
    children: dict[tuple[str, str], _Open] = field(default_factory=dict)  # (kind, key) -> run
    has_input: bool = False


def import_extra(module: str, *, feature: str, extra: str) -> Any:
    """Import ``module`` of an optional extra, or raise :class:`MissingExtraError`
    naming ``pip install "agent-lattice[<extra>]"``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(feature, module.split(".")[0], extra, reason=str(exc)) from exc


def w3c_propagator(*, feature: str, extra: str) -> Any:
    """OpenTelemetry's W3C trace-context propagator (``traceparent`` / ``tracestate``)."""
    module = import_extra("opentelemetry.trace.propagation.tracecontext", feature=feature, extra=extra)
    return module.TraceContextTextMapPropagator()


def event_time(event: dict[str, Any]) -> datetime:
    """The event's ``timestamp`` as an aware UTC datetime (now when missing or unreadable)."""
    raw = event.get("timestamp")
    if isinstance(raw, str):
        try:
            parsed = datetime.fromisoformat(raw)
            return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
        except ValueError:
            pass
    return datetime.now(UTC)


def text_of(content: Any) -> str:
    """The text of a message or tool-result ``content`` (a string or a list of blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def to_json(value: Any) -> str:
    """``value`` as compact JSON (unencodable values by ``repr``)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)


def usage_counts(usage: dict[str, Any] | None) -> dict[str, int]:
    """The four Anthropic usage counts of ``usage`` (missing ones are 0)."""
    usage = usage or {}
    keys = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    return {k: int(usage[k]) if isinstance(usage.get(k), int) else 0 for k in keys}


def _is_tool_results_only(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    return (
        isinstance(content, list)
        and bool(content)
        and all(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    )


class EventProjector:
    """Keeps the open runs of every chain and turns each event into backend calls.

    Not thread-safe on its own; :class:`ProjectedContextTracer` serialises calls.
    """

    def __init__(self, backend: TraceBackend) -> None:
        self.backend = backend
        self.chains: dict[str, _Open] = {}
        self.recent: collections.OrderedDict[str, Any] = collections.OrderedDict()

    # -- the event stream ---------------------------------------------------------------

    def handle(self, event: dict[str, Any]) -> None:
        type_ = event.get("type")
        run_id = event.get("run_id")
        if not isinstance(type_, str) or not isinstance(run_id, str):
            raise ValueError(f"trace event without a type and a run_id: {event!r:.200}")
        data = event.get("data") if isinstance(event.get("data"), dict) else {}
        when = event_time(event)
        if type_ == "run_start":
            self._run_start(event, run_id, data, when)
            return
        chain = self.chains.get(run_id)
        if chain is None:
            logger.debug(
                "trace event %s for a run this tracer has not seen open (%s); dropped", type_, run_id
            )
            return
        if type_ == "user_message":
            self._user_message(chain, data, when)
        elif type_ == "model_request":
            self._model_request(chain, data, when)
        elif type_ == "assistant_message":
            self._assistant_message(chain, data, when)
        elif type_ == "tool_use":
            self._tool_use(chain, data, when)
        elif type_ == "tool_result":
            self._tool_result(chain, data, when)
        elif type_ == "result":
            self._result(run_id, chain, data, when)
        else:
            self.backend.add_event(chain.handle, type_, data, when)

    def _run_start(self, event: dict[str, Any], run_id: str, data: dict[str, Any], when: datetime) -> None:
        if run_id in self.chains:
            logger.debug("a second run_start for run %s; ignored", run_id)
            return
        source = dict(event.get("source") or {})
        parent_run_id = event.get("parent_run_id")
        parent_open = self.chains.get(parent_run_id) if isinstance(parent_run_id, str) else None
        parent_handle = parent_open.handle if parent_open is not None else None
        if parent_open is None and isinstance(parent_run_id, str):
            parent_handle = self.recent.get(parent_run_id)
        remote = event.get("remote_parent") if parent_handle is None else None
        metadata = {
            "run_id": run_id,
            "session_id": event.get("session_id"),
            "source": source,
        }
        for key in ("agent_session_id", "parent_run_id"):
            if event.get(key) is not None:
                metadata[key] = event[key]
        if data.get("agent_session_id") is not None:
            metadata.setdefault("agent_session_id", data["agent_session_id"])
        start = RunStart(
            kind="chain",
            name=str(source.get("name") or data.get("name") or source.get("kind") or "agent"),
            run_id=run_id,
            session_id=event.get("session_id"),
            source=source,
            start_time=when,
            inputs=dict(data),
            metadata=metadata,
            parent=parent_handle,
            remote_parent=dict(remote) if isinstance(remote, dict) and remote else None,
            model=data.get("model") if isinstance(data.get("model"), str) else None,
        )
        handle = self.backend.start_run(start)
        run = _Open(start, handle, parent=parent_open)
        self.chains[run_id] = run
        if parent_open is not None:
            parent_open.children[("chain", run_id)] = run

    def _user_message(self, chain: _Open, data: dict[str, Any], when: datetime) -> None:
        message = data.get("message")
        if not isinstance(message, dict):
            return
        if not chain.has_input and not chain.children:
            chain.has_input = True
            self.backend.set_chain_input(chain.handle, message)
        elif not _is_tool_results_only(message):  # tool results already show on their tool runs
            self.backend.add_event(chain.handle, "user_message", data, when)

    def _model_request(self, chain: _Open, data: dict[str, Any], when: datetime) -> None:
        self._end_children(chain, kinds=("llm",), error="a new model request started", when=when)
        model = data.get("model") if isinstance(data.get("model"), str) else chain.start.model
        inputs = {k: v for k, v in data.items() if k not in ("turn", "system_prompt")}
        if data.get("system_prompt") is not None:
            inputs["system"] = data["system_prompt"]
        start = RunStart(
            kind="llm",
            name=model or "model",
            run_id=chain.start.run_id,
            session_id=chain.start.session_id,
            source=chain.start.source,
            start_time=when,
            inputs=inputs,
            metadata={"turn": data.get("turn"), "run_id": chain.start.run_id},
            parent=chain.handle,
            model=model,
            max_tokens=data.get("max_tokens") if isinstance(data.get("max_tokens"), int) else None,
        )
        chain.children[("llm", "current")] = _Open(start, self.backend.start_run(start))

    def _assistant_message(self, chain: _Open, data: dict[str, Any], when: datetime) -> None:
        llm = chain.children.pop(("llm", "current"), None)
        if llm is None:
            return
        message = data.get("message") if isinstance(data.get("message"), dict) else {}
        stop = message.get("stop_reason")
        end = RunEnd(
            end_time=when,
            outputs={k: v for k, v in message.items() if k != "usage"},
            usage=usage_counts(message.get("usage")) if message.get("usage") is not None else None,
            response_model=message.get("model") if isinstance(message.get("model"), str) else None,
            response_id=message.get("provider_response_id")
            if isinstance(message.get("provider_response_id"), str)
            else None,
            finish_reasons=[stop] if isinstance(stop, str) else None,
        )
        self.backend.end_run(llm.handle, llm.start, end)

    def _tool_use(self, chain: _Open, data: dict[str, Any], when: datetime) -> None:
        key = str(data.get("tool_use_id"))
        name = str(data.get("name") or "tool")
        description = data.get("description") if isinstance(data.get("description"), str) else None
        metadata: dict[str, Any] = {"tool_use_id": data.get("tool_use_id"), "run_id": chain.start.run_id}
        if description is not None:
            metadata["tool_description"] = description
        start = RunStart(
            kind="tool",
            name=name,
            run_id=chain.start.run_id,
            session_id=chain.start.session_id,
            source=chain.start.source,
            start_time=when,
            inputs=data.get("input") if isinstance(data.get("input"), dict) else {"input": data.get("input")},
            metadata=metadata,
            parent=chain.handle,
            tool_name=name,
            tool_use_id=data.get("tool_use_id") if isinstance(data.get("tool_use_id"), str) else None,
            tool_description=description,
        )
        self._end_children(chain, keys=[("tool", key)], error="a second call with the same id", when=when)
        chain.children[("tool", key)] = _Open(start, self.backend.start_run(start))

    def _tool_result(self, chain: _Open, data: dict[str, Any], when: datetime) -> None:
        run = chain.children.pop(("tool", str(data.get("tool_use_id"))), None)
        if run is None:
            return
        block = data.get("result") if isinstance(data.get("result"), dict) else {}
        content = block.get("content")
        error = None
        if data.get("is_error") or block.get("is_error"):
            error = text_of(content) or "tool error"
        end = RunEnd(
            end_time=when,
            outputs={"content": content, "is_error": bool(error)},
            error=error,
            error_type="tool_error" if error else None,
        )
        self.backend.end_run(run.handle, run.start, end)

    def _result(self, run_id: str, chain: _Open, data: dict[str, Any], when: datetime) -> None:
        is_error = bool(data.get("is_error"))
        subtype = str(data.get("subtype") or ("error" if is_error else "success"))
        error = None
        if is_error:
            detail = data.get("error")
            error = f"{subtype}: {detail}" if detail else subtype
        error_type = (data.get("error_type") or subtype) if is_error else None
        self._end_children(
            chain, error=error or f"the run ended ({subtype}) first", error_type=error_type, when=when
        )
        keep = ("subtype", "result", "structured_result", "usage", "num_turns", "stop_reason", "error")
        outputs = {k: data[k] for k in keep if data.get(k) is not None}
        end = RunEnd(
            end_time=when,
            outputs=outputs,
            error=error,
            error_type=error_type,
            usage=usage_counts(data.get("usage")) if isinstance(data.get("usage"), dict) else None,
        )
        self._finish_chain(run_id, chain, end)

    # -- ending -------------------------------------------------------------------------

    def _finish_chain(self, run_id: str, chain: _Open, end: RunEnd) -> None:
        self.chains.pop(run_id, None)
        if chain.parent is not None:
            chain.parent.children.pop(("chain", run_id), None)
        self.backend.end_run(chain.handle, chain.start, end)
        self.recent[run_id] = chain.handle
        while len(self.recent) > _RECENT_CHAINS:
            self.recent.popitem(last=False)

    def _end_children(
        self,
        chain: _Open,
        *,
        error: str,
        when: datetime,
        error_type: str | None = None,
        kinds: tuple[str, ...] | None = None,
        keys: list[tuple[str, str]] | None = None,
    ) -> None:
        """End still-open children (newest first, each one's own children first)."""
        selected = keys if keys is not None else list(chain.children)
        for key in reversed(selected):
            if kinds is not None and key[0] not in kinds:
                continue
            child = chain.children.pop(key, None)
            if child is None:
                continue
            self._end_children(child, error=error, error_type=error_type, when=when)
            end = RunEnd(end_time=when, error=error, error_type=error_type or "incomplete")
            if child.start.kind == "chain":
                self._finish_chain(child.start.run_id, child, end)
            else:
                self.backend.end_run(child.handle, child.start, end)

    def close_all(self, error: str = CLOSED_BEFORE_END) -> None:
        """End every open run, children before parents (the tracer is closing)."""
        now = datetime.now(UTC)
        roots = [(rid, c) for rid, c in list(self.chains.items()) if c.parent is None]
        for run_id, chain in reversed(roots):
            self._end_children(chain, error=error, when=now)
            self._finish_chain(run_id, chain, RunEnd(end_time=now, error=error, error_type="incomplete"))

    def carrier(self, run_id: str) -> dict[str, str]:
        chain = self.chains.get(run_id)
        handle = chain.handle if chain is not None else self.recent.get(run_id)
        return self.backend.carrier(handle) if handle is not None else {}


class ProjectedContextTracer:
    """A ``ContextTracer`` that projects events onto a backend's run tree.

    Built by the ``create_*_context_tracer`` factories of the LangSmith,
    Langfuse and OpenTelemetry tracers. ``backend`` is the backend adapter.

    Failures (a malformed event, a backend call that raises) are counted in
    ``failures``; with ``fail_on_error=True`` they raise (and so fail the run),
    otherwise the first one is logged as a warning on ``lattice_worker.tracing``
    and the rest only counted.
    """

    def __init__(self, backend: Any, *, name: str, fail_on_error: bool = False) -> None:
        self.backend = backend
        self.name = name
        self.fail_on_error = bool(fail_on_error)
        self.failures = 0
        self._seq = SeqCounter()
        self._lock = threading.Lock()
        self._projector = EventProjector(backend)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, fail_on_error={self.fail_on_error})"

    @property
    def open_runs(self) -> int:
        """How many chains are open (started, no ``result`` yet)."""
        return len(self._projector.chains)

    async def on_event(self, event: dict[str, Any]) -> None:
        """Project one event; ``seq`` is filled when missing (kept when present)."""
        try:
            if not isinstance(event, dict):
                raise TypeError(f"trace event must be a dict, got {type(event).__name__}")
            if event.get("seq") is None:
                event = {**event, "seq": self._seq.next()}
            with self._lock:
                self._projector.handle(event)
        except Exception as exc:
            self._failed(exc, f"a {event.get('type', '?') if isinstance(event, dict) else '?'} event")

    def trace_carrier(self, run_id: str) -> dict[str, str]:
        """Propagation headers of run ``run_id`` (open or recently ended), ``{}`` when unknown."""
        with self._lock:
            return self._projector.carrier(run_id)

    async def flush(self) -> None:
        """Hand everything recorded so far to the backend's exporter and wait for it
        (in a worker thread: the exporters block on the network)."""
        try:
            await asyncio.to_thread(self.backend.flush)
        except Exception as exc:
            self._failed(exc, "flush")

    async def close(self) -> None:
        """End every run still open (as errors: ``the tracer was closed before
        this run ended``), children first, then :meth:`flush`. The tracer keeps
        accepting events afterwards."""
        try:
            with self._lock:
                self._projector.close_all()
        except Exception as exc:
            self._failed(exc, "close")
        await self.flush()

    def _failed(self, exc: Exception, what: str) -> None:
        self.failures += 1
        if self.fail_on_error:
            raise exc
        if self.failures == 1:
            logger.warning(
                "%s tracer failed on %s; the run goes on (further failures of this tracer are counted, "
                "not logged)",
                self.name,
                what,
                exc_info=exc,
            )


__all__ = [
    "CLOSED_BEFORE_END",
    "EventProjector",
    "ProjectedContextTracer",
    "RunEnd",
    "RunStart",
    "TraceBackend",
    "event_time",
    "import_extra",
    "text_of",
    "to_json",
    "usage_counts",
    "w3c_propagator",
]
