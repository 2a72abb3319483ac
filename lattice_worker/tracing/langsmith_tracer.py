"""The LangSmith tracer: agent runs, model calls and tool calls as LangSmith runs,
built with langsmith's own ``RunTree``.

==========================================  ===================================
events                                      LangSmith run
==========================================  ===================================
``run_start`` .. ``result``                 ``chain`` run named after the agent
                                            (or team); a root unless
                                            ``parent_run_id`` names a chain
                                            this tracer saw (a team's lead and
                                            members under the team's root)
``model_request`` .. ``assistant_message``  child ``llm`` run named after the
                                            model: inputs ``messages`` /
                                            ``system`` / ``tools``, outputs the
                                            assistant message, usage in
                                            ``usage_metadata``, ``ls_provider``
                                            / ``ls_model_name`` metadata
``tool_use`` .. ``tool_result``             child ``tool`` run named after the
                                            tool, ``tool_description`` metadata
``team_message``, ``team_agent``, injected  run events on their chain
user messages
==========================================  ===================================

A chain's inputs are its first user message; its metadata the ``run_start``
data and the trace ids (``run_id``, ``session_id``, ``agent_session_id``,
``source``). Failed runs carry ``error``. Runs are posted when they start (a
chain when its first child starts, so that its inputs are complete) and patched
when they end, children before parents; LangSmith's client batches both in the
background, and :meth:`flush` waits for that queue.

Distributed traces: :func:`~.base.trace_carrier` gives a run's
``langsmith-trace`` (dotted order) and ``langsmith-baggage`` headers; a chain
started with them in ``TraceContext.remote_parent`` is that run's child.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .projection import ProjectedContextTracer, RunEnd, RunStart, import_extra

_FEATURE = "create_langsmith_context_tracer"
_EXTRA = "langsmith"

TRACE_HEADER = "langsmith-trace"
BAGGAGE_HEADER = "langsmith-baggage"


@dataclass
class _Run:
    tree: Any
    parent: _Run | None
    posted: bool = False


class LangSmithBackend:
    """Runs on langsmith ``RunTree`` objects (or an injected class with the same API)."""

    def __init__(self, *, run_tree: Any, client: Any, project_name: str | None, tags: list[str]) -> None:
        self.run_tree = run_tree
        self.client = client
        self.project_name = project_name
        self.tags = tags

    def _post(self, run: _Run) -> None:
        if run.posted:
            return
        if run.parent is not None:
            self._post(run.parent)
        run.tree.post()
        run.posted = True

    def start_run(self, start: RunStart) -> Any:
        metadata = dict(start.metadata)
        parent: _Run | None = start.parent
        if start.kind == "chain":
            metadata.update({k: v for k, v in start.inputs.items() if k not in metadata})
            extra = {"metadata": metadata}
            kwargs: dict[str, Any] = {"inputs": {}, "start_time": start.start_time, "extra": extra}
            kwargs["tags"] = list(self.tags)
            if parent is not None:
                tree = parent.tree.create_child(start.name, "chain", **kwargs)
            else:
                remote = self._remote_parent(start.remote_parent)
                if remote is not None:
                    tree = remote.create_child(start.name, "chain", **kwargs)
                else:
                    if self.project_name:
                        kwargs["project_name"] = self.project_name
                    if self.client is not None:
                        kwargs["client"] = self.client
                    tree = self.run_tree(name=start.name, run_type="chain", **kwargs)
            return _Run(tree, parent)  # posted with its first child, or when it ends

        assert parent is not None
        if start.kind == "llm":
            metadata.update(
                {
                    "ls_provider": "anthropic",
                    "ls_model_type": "chat",
                    "ls_model_name": start.model,
                    "ls_max_tokens": start.max_tokens,
                }
            )
            run_type = "llm"
        else:
            run_type = "tool"
        tree = parent.tree.create_child(
            start.name,
            run_type,
            inputs=dict(start.inputs),
            start_time=start.start_time,
            extra={"metadata": metadata},
        )
        run = _Run(tree, parent)
        self._post(run)
        return run

    def _remote_parent(self, headers: dict[str, str] | None) -> Any:
        if not headers or not headers.get(TRACE_HEADER):
            return None
        from_headers = getattr(self.run_tree, "from_headers", None)
        if not callable(from_headers):
            return None
        wire = {TRACE_HEADER: headers[TRACE_HEADER]}
        if headers.get(BAGGAGE_HEADER):
            wire["baggage"] = headers[BAGGAGE_HEADER]
        kwargs = {"client": self.client} if self.client is not None else {}
        return from_headers(wire, **kwargs)

    def set_chain_input(self, handle: Any, message: dict[str, Any]) -> None:
        handle.tree.add_inputs({"messages": [message]})

    def end_run(self, handle: Any, start: RunStart, end: RunEnd) -> None:
        outputs = dict(end.outputs or {})
        if start.kind == "llm" and end.usage is not None:
            usage = _usage_metadata(end.usage)
            outputs["usage_metadata"] = usage
            handle.tree.add_metadata({"usage_metadata": usage})
        if start.kind == "tool" and "content" in outputs:
            outputs = {"output": outputs["content"], "is_error": outputs.get("is_error", False)}
        handle.tree.end(outputs=outputs, error=end.error, end_time=end.end_time)
        self._post(handle)
        handle.tree.patch()
        # RunTree keeps every child in its parent's child_runs; once a run is sent nothing
        # needs it there, and a long chain would otherwise hold every turn's full inputs.
        if handle.parent is not None:
            siblings = getattr(handle.parent.tree, "child_runs", None)
            if isinstance(siblings, list):
                siblings[:] = [child for child in siblings if child is not handle.tree]

    def add_event(self, handle: Any, name: str, data: dict[str, Any], time: Any) -> None:
        handle.tree.add_event({"name": name, "time": time.isoformat(), "kwargs": data})

    def carrier(self, handle: Any) -> dict[str, str]:
        headers = handle.tree.to_headers()
        out = {TRACE_HEADER: headers[TRACE_HEADER]} if headers.get(TRACE_HEADER) else {}
        if headers.get("baggage"):
            out[BAGGAGE_HEADER] = headers["baggage"]
        return out

    def flush(self) -> None:
        flush = getattr(self.client, "flush", None)
        if callable(flush):
            flush()


def _usage_metadata(usage: dict[str, int]) -> dict[str, Any]:
    """LangSmith's ``usage_metadata``: Anthropic counts cache reads and writes apart
    from ``input_tokens``; LangSmith's input total includes them, with the split
    in ``input_token_details``."""
    details = {}
    if usage["cache_read_input_tokens"]:
        details["cache_read"] = usage["cache_read_input_tokens"]
    if usage["cache_creation_input_tokens"]:
        details["cache_creation"] = usage["cache_creation_input_tokens"]
    input_tokens = usage["input_tokens"] + sum(details.values())
    out: dict[str, Any] = {
        "input_tokens": input_tokens,
        "output_tokens": usage["output_tokens"],
        "total_tokens": input_tokens + usage["output_tokens"],
    }
    if details:
        out["input_token_details"] = details
    return out


class LangSmithContextTracer(ProjectedContextTracer):
    """The LangSmith tracer built by :func:`create_langsmith_context_tracer`.
    ``client`` is the langsmith client its runs go through."""

    client: Any


def create_langsmith_context_tracer(
    *,
    project_name: str | None = None,
    api_key: str | None = None,
    api_url: str | None = None,
    workspace_id: str | None = None,
    client: Any = None,
    run_tree: Any = None,
    tags: list[str] | None = None,
    fail_on_error: bool = False,
) -> LangSmithContextTracer:
    """A trace sink projecting runs onto LangSmith (see the module docstring for the tree).

    Configuration follows LangSmith's own: without arguments the client reads
    ``LANGSMITH_API_KEY``, ``LANGSMITH_ENDPOINT``, ``LANGSMITH_PROJECT`` and
    ``LANGSMITH_WORKSPACE_ID``. ``api_key`` / ``api_url`` / ``workspace_id``
    build a ``langsmith.Client`` with those values (``workspace_id`` only picks a
    workspace for org-scoped keys; it is not the project). ``project_name`` is
    the tracing project. ``tags`` go on every chain run.

    ``client`` (a ``langsmith.Client`` or anything with ``create_run`` /
    ``update_run`` / ``flush``) and ``run_tree`` (the ``RunTree`` class, or a
    callable taking its keyword arguments) replace langsmith's runtime, for
    tests or custom transports. ``flush()`` waits until the client sent
    everything queued; ``close()`` first ends the runs still open (as errors).
    ``fail_on_error`` as for every tracer: by default a failing LangSmith call is
    logged once and never fails a run.

    Raises :class:`~lattice_worker.errors.MissingExtraError` (a ``ConfigError``
    and an ``ImportError``) when ``langsmith`` is not installed
    (``pip install "agent-lattice[langsmith]"``) and ``ConfigError`` when
    ``client`` is given together with ``api_key`` / ``api_url`` / ``workspace_id``,
    or ``run_tree`` is not callable.
    """
    explicit = {"api_key": api_key, "api_url": api_url, "workspace_id": workspace_id}
    if client is not None and any(v is not None for v in explicit.values()):
        raise ConfigError(
            "create_langsmith_context_tracer: give either client= or api_key=/api_url=/workspace_id=, not both"
        )
    if run_tree is not None and not callable(run_tree):
        raise ConfigError("create_langsmith_context_tracer: run_tree must be the RunTree class or a callable")
    if run_tree is None or client is None:
        langsmith = import_extra("langsmith", feature=_FEATURE, extra=_EXTRA)
        if run_tree is None:
            run_tree = langsmith.RunTree
        if client is None:
            client = langsmith.Client(**{k: v for k, v in explicit.items() if v is not None})
    backend = LangSmithBackend(
        run_tree=run_tree, client=client, project_name=project_name, tags=list(tags or [])
    )
    tracer = LangSmithContextTracer(backend, name="LangSmith", fail_on_error=fail_on_error)
    tracer.client = client
    return tracer


__all__ = ["LangSmithContextTracer", "create_langsmith_context_tracer"]
