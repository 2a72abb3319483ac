"""The state of one running query and the steps the agent loop takes with it.

:class:`QueryRun` holds one query's state (turns, usage, the abort signal, the
trace emitter) and does the loop's individual steps: build a model request
(hook, then request normalisation), start and end the model call (raced
against abort, interrupt and timeout), run a tool batch (then hooks and the
tool result bound), compact the history, build the final ``result``. The
order of the steps is :func:`lattice_worker.agent.loop.run_query`'s.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import AbortError, MaxTurnsError
from ..tracing.base import TraceContext, TraceEmitter
from .abort import AbortSignal
from .call_gate import current_call_gate
from .compaction import CompactionError, choose_cut, compacted_history, summary_request_messages, summary_text
from .events import ResultMessage, SystemMessage
from .hooks import ModelRequestHookContext, ToolResultHookContext
from .model import AssistantModelMessage, ModelRequest, TokenUsage
from .normalize import normalize_messages
from .options import DEFAULT_MAX_TOKENS, QueryOptions, thinking_budget
from .result_limits import bound_tool_result
from .suspend import SuspendQuery
from .tool_batch import CallOutcome, ToolBatchRunner

if TYPE_CHECKING:
    from ..tools.tool import ToolDefinition
    from .options import AgentOptions

logger = logging.getLogger("lattice_worker.agent")


class LoopAgent(Protocol):
    """What the loop uses of the agent whose query it runs
    (:class:`lattice_worker.agent.agent.Agent`, which imports this module)."""

    options: AgentOptions
    session_id: str
    _history: list[dict[str, Any]]
    _control: RunControl | None
    _query_lock: threading.Lock
    _context_tokens: int | None

    @property
    def name(self) -> str | None: ...

    def _tool_map(self) -> dict[str, ToolDefinition]: ...

    def _request_tools(self) -> list[ToolDefinition]: ...

    def _system_prompt(self, skills: str | None = None) -> str | None: ...

    def _model_client(self) -> Any: ...

    async def _ensure_history_loaded(self) -> None: ...

    async def _append(self, message: dict[str, Any]) -> None: ...

    async def _rewrite_history(self, messages: list[dict[str, Any]]) -> None: ...

    def _skills_section(self, prompt: Any) -> str | None: ...


class RunControl:
    """Per-query control shared with ``Agent.interrupt()``: the interrupt flag and
    the inbox of the model call in flight. Thread-safe to signal."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.thread_id = threading.get_ident()
        self.interrupted = False
        self.inbox: asyncio.Queue[tuple[str, Any]] | None = None

    def post(self, inbox: asyncio.Queue[tuple[str, Any]], item: tuple[str, Any]) -> None:
        if threading.get_ident() == self.thread_id:
            inbox.put_nowait(item)
        else:
            try:
                self.loop.call_soon_threadsafe(inbox.put_nowait, item)
            except RuntimeError:  # loop closed
                pass

    def interrupt(self) -> None:
        self.interrupted = True
        inbox = self.inbox
        if inbox is not None:
            self.post(inbox, ("interrupt", None))


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


async def _create(agent: Any, request: ModelRequest) -> AssistantModelMessage:
    out = agent._model_client().create_message(request)
    if inspect.isawaitable(out):
        out = await out
    return out


def _swallow(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


_IMMUTABLE = frozenset({str, int, float, bool, type(None)})


def copy_json(value: Any) -> Any:
    """A deep copy of ``value``. Messages and events are JSON-like (dicts,
    lists, strings, numbers): those are copied directly, several times faster
    than ``copy.deepcopy``; anything else (a tuple, a dict subclass, an
    object) is handed to ``copy.deepcopy``."""
    kind = type(value)
    if kind is dict:
        return {key: copy_json(item) for key, item in value.items()}
    if kind is list:
        return [copy_json(item) for item in value]
    if kind in _IMMUTABLE:
        return value
    return copy.deepcopy(value)


class Finish:
    """The terminal decision of a query."""

    def __init__(
        self,
        subtype: str,
        *,
        error: BaseException | None = None,
        result: str | None = None,
        structured: Any = None,
    ) -> None:
        self.subtype = subtype
        self.error = error
        self.result = result
        self.structured = structured


class QueryRun:
    """State of one query; helpers used by :func:`run_query`."""

    def __init__(self, agent: LoopAgent, q: QueryOptions, control: RunControl) -> None:
        self.agent = agent
        self.q = q
        self.control = control
        self.skills: str | None = None  # the matched skills' prompt section (set by run_query)
        opts = agent.options
        self.started = time.monotonic()
        self.session_id = agent.session_id
        self.signal: AbortSignal = q.signal if q.signal is not None else AbortSignal()
        self.turns = 0
        self.usage = TokenUsage()
        self.stop_reason: str | None = None
        self.last_text = ""
        self.hooks = opts.hooks
        self.last_outcomes: list[CallOutcome] = []
        self.structured = opts.output_schema is not None
        self.max_turns = opts.max_turns
        self.compaction = opts.compaction
        self.recovered = False  # overflow recovery: at most once per query
        self.thinking_config = thinking_budget(
            q.thinking_config if q.thinking_config is not None else opts.thinking_config, opts.max_tokens
        )
        self.timeout_ms = (
            q.request_timeout_ms if q.request_timeout_ms is not None else opts.request_timeout_ms
        )
        tracer = q.tracer if q.tracer is not None else opts.tracer
        context = q.trace_context
        if context is None:
            context = TraceContext(
                session_id=agent.session_id,
                source={"kind": "agent", "name": agent.name or "agent"},
            )
        self.emitter = TraceEmitter(tracer, context)

    # ---------------------------------------------------------------- tracing / history

    async def trace(self, type_: str, data: dict[str, Any]) -> None:
        if self.emitter.enabled:
            await self.emitter.emit(type_, copy_json(data))

    async def add_user_message(self, message: dict[str, Any]) -> None:
        await self.agent._append(message)
        await self.trace("user_message", {"message": message})

    # ---------------------------------------------------------------------- requests

    def thinking(self) -> dict[str, Any] | None:
        config = self.thinking_config
        return dict(config) if config is not None else None

    def max_tokens(self) -> int:
        return self.agent.options.max_tokens or DEFAULT_MAX_TOKENS

    async def build_request(self, *, retry: bool = False) -> ModelRequest:
        """The next model request; ``retry``: the same turn again (after an
        overflow recovery), so the turn count does not grow."""
        if not retry:
            self.turns += 1
        agent = self.agent
        tools = agent._request_tools()
        messages = list(agent._history)
        system = agent._system_prompt(self.skills)
        hooks = self.hooks
        if hooks is not None and hooks.on_model_request is not None:
            # the hook gets its own deep copy (hooks.py); the history itself is never handed out
            ctx = ModelRequestHookContext(messages=messages, system_prompt=system, turn=self.turns)
            messages, system = await hooks.run_model_request(ctx)
        messages = normalize_messages(messages)
        request = ModelRequest(
            model=agent.options.model,
            system=system,
            messages=messages,
            tools=[t.to_model_tool() for t in tools],
            max_tokens=self.max_tokens(),
            stream=self.q.stream,
            thinking=self.thinking(),
            reasoning_effort=(
                self.q.reasoning_effort
                if self.q.reasoning_effort is not None
                else agent.options.reasoning_effort
            ),
            output_format=self.q.output_format,
            timeout_ms=self.timeout_ms,
            signal=self.signal,
        )
        await self.trace(
            "model_request",
            {
                "turn": self.turns,
                "model": request.model,
                "system_prompt": request.system,
                "messages": request.messages,
                "tools": [t["name"] for t in request.tools],
                "stream": request.stream,
                "max_tokens": request.max_tokens,
            },
        )
        return request

    def start_call(
        self, request: ModelRequest
    ) -> tuple[asyncio.Task[Any], asyncio.Queue[tuple[str, Any]], Any]:
        """Start the model call; every outcome (stream event, completion, abort,
        interrupt, timeout) arrives on the returned inbox, in order."""
        loop = self.control.loop
        inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.control.inbox = inbox
        if self.control.interrupted:
            inbox.put_nowait(("interrupt", None))
        if request.stream and getattr(self.q.runtime, "wants_stream_events", True) is not False:
            request.on_stream_event = lambda event: inbox.put_nowait(("event", event))
        agent = self.agent

        gate = current_call_gate.get()

        async def call() -> AssistantModelMessage:
            if gate is None:
                return await _create(agent, request)
            ticket = await gate.before_call(request)  # may raise SuspendQuery: no request is sent
            usage = None
            try:
                out = await _create(agent, request)
                usage = getattr(out, "usage", None)
                return out
            finally:  # a failed or abandoned call too: its ticket is released
                await gate.after_call(usage, ticket)

        task = loop.create_task(call())
        task.add_done_callback(lambda t: inbox.put_nowait(("done", t)))
        remove = self.signal.add_listener(lambda reason: self.control.post(inbox, ("abort", reason)))
        timer = None
        if self.timeout_ms is not None:
            timer = loop.call_later(self.timeout_ms / 1000.0, inbox.put_nowait, ("timeout", None))
        return task, inbox, (remove, timer)

    def end_call(self, task: asyncio.Task[Any], handles: Any) -> None:
        remove, timer = handles
        remove()
        if timer is not None:
            timer.cancel()
        self.control.inbox = None
        if not task.done():
            # Abandon the call: cancel it, never wait for a client that ignores cancellation.
            task.cancel()
            task.add_done_callback(_swallow)

    # -------------------------------------------------------------------- compaction

    async def compact(self, trigger: str) -> SystemMessage | None:
        """Compact the history if ``auto_compact`` is on and -- for ``trigger``
        ``"threshold"`` -- the last response reported more input tokens than the
        threshold; ``"overflow"``: the recovery after an overflow (once per query).

        Returns the ``compaction`` event, or ``None`` when nothing was compacted
        (off, under the threshold, no safe cut, the summary request failed, or
        the query was aborted or interrupted -- the loop's next stop check ends it).
        """
        settings = self.compaction
        agent = self.agent
        if settings is None:
            return None
        if self.stop_check(retry=True) is not None:  # aborted or interrupted: no summary request
            return None
        if trigger == "threshold":
            tokens = agent._context_tokens
            if tokens is None or tokens <= settings.threshold_tokens:
                return None
        else:
            if self.recovered:
                return None
            self.recovered = True
        agent._context_tokens = None  # tried now; the next response reports afresh
        history = agent._history
        cut = choose_cut(history, settings.keep_recent_messages)
        if cut is None:
            logger.info("auto_compact (%s): no safe cut leaves anything to summarise; skipped", trigger)
            return None
        request = ModelRequest(
            model=settings.model or agent.options.model,
            system=None,
            messages=normalize_messages(summary_request_messages(history[:cut], settings.prompt)),
            max_tokens=settings.max_tokens or self.max_tokens(),
            stream=self.q.stream,
            timeout_ms=self.timeout_ms,
            signal=self.signal,
        )
        task, inbox, handles = self.start_call(request)
        try:
            kind = "event"
            while kind == "event":  # the summary's raw stream events are not part of the conversation
                kind, _ = await inbox.get()
        finally:
            self.end_call(task, handles)
        if kind in ("abort", "interrupt"):
            return None  # the interrupt flag / the signal is set: the loop's next stop check ends the query
        try:
            if kind == "timeout":
                raise CompactionError(f"the summary request exceeded request_timeout_ms={self.timeout_ms} ms")
            if task.cancelled():
                raise CompactionError("the summary request was cancelled")
            reply = task.result()
            if not isinstance(reply, AssistantModelMessage):
                raise CompactionError(f"the model client returned {type(reply).__name__}")
            usage = TokenUsage.from_any(reply.usage)
            self.usage.add(usage)
            summary = summary_text(reply)
        except Exception as exc:
            logger.warning("auto_compact (%s): the summary request failed; not compacted: %s", trigger, exc)
            return None
        await agent._rewrite_history(compacted_history(history, cut, summary))
        await self.trace(
            "compaction",
            {
                "trigger": trigger,
                "model": request.model,
                "compacted_messages": cut,
                "retained_messages": len(history) - cut,
                "summary": summary,
                "usage": usage.to_dict(),
            },
        )
        return SystemMessage(
            subtype="compaction",
            session_id=self.session_id,
            model=agent.options.model,
            name=agent.name,
            tools=list(agent._tool_map()),
            stream=self.q.stream,
            trigger=trigger,  # type: ignore[arg-type]
            compacted_messages=cut,
            retained_messages=len(history) - cut,
            usage=usage.to_dict(),
        )

    # ------------------------------------------------------------------------ finish

    def stop_check(self, *, retry: bool = False) -> Finish | None:
        if self.signal.aborted:
            return abort_finish(self.signal)
        if self.control.interrupted:
            return Finish("interrupted")
        if not retry and self.turns >= self.max_turns:
            return Finish(
                "error_max_turns",
                error=MaxTurnsError(f"reached max_turns={self.max_turns} model requests without finishing"),
            )
        return None

    async def finish(self, decision: Finish) -> ResultMessage:
        subtype = decision.subtype
        error = decision.error
        is_error = subtype.startswith("error")
        message = None
        if error is not None:
            message = str(error) or type(error).__name__
        result = ResultMessage(
            subtype=subtype,  # type: ignore[arg-type]
            is_error=is_error,
            session_id=self.session_id,
            result=decision.result if decision.result is not None else self.last_text,
            structured_result=decision.structured,
            usage=self.usage.to_dict(),
            stop_reason=self.stop_reason,
            num_turns=self.turns,
            duration_ms=int((time.monotonic() - self.started) * 1000),
            error=message,
            error_type=type(error).__name__ if error is not None else None,
            exception=error,
        )
        if self.emitter.enabled:  # the dump is for the tracer only
            await self.trace("result", result.model_dump())
        return result

    # ------------------------------------------------------------------ tool batches

    def batch_runner(self) -> ToolBatchRunner:
        opts = self.agent.options
        return ToolBatchRunner(
            tools=self.agent._tool_map(),
            concurrency=opts.tool_concurrency,
            permission=opts.permission,
            policy=opts.tool_batch_policy,
            structured=self.structured,
            signal=self.signal,
            runtime=self.q.runtime,
            agent=self.agent,
        )

    async def execute_batch(
        self, calls: list[dict[str, Any]], *, truncated: bool, invalid: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Trace the calls, run the batch, apply hooks, record the tool_result user
        message. If anything raises before the message is recorded (a hook, a
        ``fail_on_error`` tracer, cancellation), every call is answered with a
        "withheld" error result first -- never the unhooked content -- so the history
        keeps each tool_use paired with a tool_result, then the error propagates."""
        recorded = False
        try:
            tool_map = self.agent._tool_map()
            for call in calls:
                definition = tool_map.get(call.get("name", ""))
                await self.trace(
                    "tool_use",
                    {
                        "tool_use_id": call.get("id"),
                        "name": call.get("name"),
                        "input": call.get("input"),
                        "description": definition.description if definition is not None else None,
                    },
                )
            self.last_outcomes = await self.batch_runner().run(
                calls, truncated=truncated, invalid_inputs=invalid
            )
            blocks = await self.finalize_results(self.last_outcomes)
            user_message = {"role": "user", "content": blocks}
            await self.agent._append(user_message)
            recorded = True
            await self.trace("user_message", {"message": user_message})
            return user_message
        except SuspendQuery:
            # A call waits for an approval or a person (docs/contracts.md): the history keeps
            # ending with the assistant turn; the runtime's journal holds the calls done.
            raise
        except BaseException:
            if not recorded:
                withheld = {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": str(c.get("id", "")),
                            "content": "Error: this tool call's result was withheld because the host failed "
                            "while processing the batch.",
                            "is_error": True,
                        }
                        for c in calls
                    ],
                }
                try:
                    await self.agent._append(withheld)
                except Exception:
                    logger.warning("could not record withheld tool results", exc_info=True)
            raise

    async def finalize_results(self, outcomes: list[CallOutcome]) -> list[dict[str, Any]]:
        """Run ``on_tool_result`` hooks, bound each result (``max_tool_result_chars``),
        then trace it; returns the blocks."""
        blocks: list[dict[str, Any]] = []
        hooks = self.hooks
        limit = self.agent.options.max_tool_result_chars
        for outcome in outcomes:
            block = outcome.block
            call = outcome.call
            if hooks is not None and hooks.on_tool_result is not None:
                ctx = ToolResultHookContext(
                    tool_name=str(call.get("name")),
                    tool_use_id=str(call.get("id")),
                    input=call.get("input"),  # the hook gets deep copies (hooks.py)
                    result=block,
                    error=outcome.error,
                )
                block = await hooks.run_tool_result(ctx)
            block = bound_tool_result(block, limit)
            blocks.append(block)
            await self.trace(
                "tool_result",
                {
                    "tool_use_id": call.get("id"),
                    "name": call.get("name"),
                    "result": block,
                    "is_error": bool(block.get("is_error", False)),
                },
            )
        return blocks


def abort_finish(signal: AbortSignal) -> Finish:
    reason = signal.reason
    if isinstance(reason, BaseException):
        text = f"the query was aborted: {type(reason).__name__}: {reason}"
    elif reason is None or reason == "aborted":
        text = "the query was aborted"
    else:
        text = f"the query was aborted: {reason}"
    return Finish("error_abort", error=AbortError(text))


__all__ = ["Finish", "LoopAgent", "QueryRun", "RunControl", "abort_finish", "copy_json", "text_of"]
