"""The agent loop: one query of one Agent (spec "Agent Loop", "Streaming Events").

For each query: load the history store once (first query only), yield the
``system`` event, add the prompt to the history (never echoed as an event),
then repeat -- model request (racing the abort signal, ``interrupt()`` and
``request_timeout_ms``), ``assistant`` event, tool batch, ``user`` event, the
runtime's ``after_tool_batch`` -- until the model stops calling tools, a tool
ends the turn, ``submit_output`` succeeds, or a limit ends it; then exactly one
``result`` event. Events are produced lazily (the loop advances when the
consumer asks for the next one); raw stream events of the model call in flight
are buffered meanwhile, never dropped or reordered.

Seams for the team and distributed runtimes (docs/contracts.md): the query
option ``runtime`` (``async after_tool_batch(outcome) -> list[message] | None``,
may raise :class:`SuspendQuery`), ``ToolContext.runtime``, ``Agent.query(None)``
and the ``trace_context`` option.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import (
    AbortError,
    APIError,
    ConcurrentQueryError,
    ConfigError,
    LatticeError,
    MaxTurnsError,
    MissingOutputError,
    ModelTimeoutError,
)
from ..tracing.base import TraceContext, TraceEmitter
from .abort import AbortSignal
from .events import AssistantMessage, ResultMessage, SDKMessage, StreamEvent, SystemMessage, UserMessage
from .hooks import ModelRequestHookContext, ToolResultHookContext
from .model import AssistantModelMessage, ModelRequest, TokenUsage
from .options import DEFAULT_MAX_TOKENS, QueryOptions
from .output import SUBMIT_OUTPUT_TOOL_NAME, payload_text
from .tool_batch import CallOutcome, ToolBatchRunner

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .agent import Agent

logger = logging.getLogger("lattice_worker.agent")


class SuspendQuery(Exception):  # noqa: N818 - the name is the contract (docs/contracts.md)
    """Raised by a query ``runtime``'s ``after_tool_batch`` to stop the query
    without an error: it ends with a ``result`` of subtype ``"suspended"``
    (``is_error`` false) and the history intact, ready for ``Agent.query(None)``.
    Only the distributed runtime uses it. ``reason`` is free text for logs."""

    def __init__(self, reason: str = "suspended") -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class ToolBatchOutcome:
    """What ``runtime.after_tool_batch`` receives: the batch's ``tool_use`` blocks
    (``calls``), its final ``tool_result`` blocks (``results``, after hooks, in the
    same order) and the running ``agent``. ``usage``: the query's token usage
    so far (``TokenUsage.to_dict()``; no model request follows before the
    runtime answers, so a query that suspends here ends with this usage)."""

    calls: list[dict[str, Any]]
    results: list[dict[str, Any]]
    agent: Any
    usage: dict[str, Any] | None = None


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


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _reply_problem(message: AssistantModelMessage) -> str | None:
    """Why a model reply cannot enter the history (a short description), or ``None``.

    Checked: ``content`` is a list (or ``None``) of dicts with a string ``type``;
    ``text`` blocks carry a string ``text``; ``tool_use`` blocks a non-empty string
    ``id`` (unique within the reply) and a string ``name``; ``usage`` is ``None``, a
    dict or a :class:`TokenUsage`; ``stop_reason``, ``provider_response_id`` and
    ``model`` are strings or ``None``. Other block types pass as they are."""
    content = message.content if message.content is not None else []
    if not isinstance(content, list):
        return f"content is {type(content).__name__}, not a list of content blocks"
    ids: set[str] = set()
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            return f'content[{i}] is not a content block (a dict with a string "type"): {block!r:.120}'
        kind = block["type"]
        if kind == "text" and not isinstance(block.get("text"), str):
            return f'content[{i}] is a text block without a string "text"'
        if kind == "tool_use":
            tool_use_id, name = block.get("id"), block.get("name")
            if not isinstance(tool_use_id, str) or not tool_use_id:
                return f'content[{i}] is a tool_use block without a non-empty string "id"'
            if not isinstance(name, str):
                return f'content[{i}] is a tool_use block without a string "name"'
            if tool_use_id in ids:
                return f"content[{i}] repeats the tool_use id {tool_use_id!r}"
            ids.add(tool_use_id)
    if message.usage is not None and not isinstance(message.usage, TokenUsage | dict):
        return f"usage is {type(message.usage).__name__}, not a dict or TokenUsage"
    for name in ("stop_reason", "provider_response_id", "model"):
        value = getattr(message, name)
        if value is not None and not isinstance(value, str):
            return f"{name} is {type(value).__name__}, not a string"
    return None


def _swallow(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


_IMMUTABLE = frozenset({str, int, float, bool, type(None)})


def _copy(value: Any) -> Any:
    """A deep copy of ``value``. Messages and events are JSON-like (dicts,
    lists, strings, numbers): those are copied directly, several times faster
    than ``copy.deepcopy``; anything else (a tuple, a dict subclass, an
    object) is handed to ``copy.deepcopy``."""
    kind = type(value)
    if kind is dict:
        return {key: _copy(item) for key, item in value.items()}
    if kind is list:
        return [_copy(item) for item in value]
    if kind in _IMMUTABLE:
        return value
    return copy.deepcopy(value)


class _Finish:
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


class _QueryRun:
    """State of one query; helpers used by :func:`run_query`."""

    def __init__(self, agent: Agent, q: QueryOptions, control: RunControl) -> None:
        self.agent = agent
        self.q = q
        self.control = control
        opts = agent.options
        self.started = time.monotonic()
        self.session_id = agent.session_id
        self.signal: AbortSignal = q.signal if q.signal is not None else AbortSignal()
        self.turns = 0
        self.usage = TokenUsage()
        self.stop_reason: str | None = None
        self.last_text = ""
        self.hooks = opts.hooks
        self.skills: str | None = None
        self.last_outcomes: list[CallOutcome] = []
        self.structured = opts.output_schema is not None
        self.max_turns = opts.max_turns
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
            await self.emitter.emit(type_, _copy(data))

    async def add_user_message(self, message: dict[str, Any]) -> None:
        await self.agent._append(message)
        await self.trace("user_message", {"message": message})

    # ---------------------------------------------------------------------- requests

    def thinking(self) -> dict[str, Any] | None:
        config = (
            self.q.thinking_config
            if self.q.thinking_config is not None
            else self.agent.options.thinking_config
        )
        if config is None:
            return None
        config = dict(config)
        if config.get("type") == "enabled":
            cap = self.max_tokens() - 1
            if config["budget_tokens"] > cap:
                config["budget_tokens"] = max(cap, 1)
        return config

    def max_tokens(self) -> int:
        return self.agent.options.max_tokens or DEFAULT_MAX_TOKENS

    async def build_request(self) -> ModelRequest:
        self.turns += 1
        agent = self.agent
        tools = agent._tool_map()
        messages = list(agent._history)
        system = agent._system_prompt(self.skills)
        hooks = self.hooks
        if hooks is not None and hooks.on_model_request is not None:
            # the hook gets its own deep copy (hooks.py); the history itself is never handed out
            ctx = ModelRequestHookContext(messages=messages, system_prompt=system, turn=self.turns)
            messages, system = await hooks.run_model_request(ctx)
        request = ModelRequest(
            model=agent.options.model,
            system=system,
            messages=messages,
            tools=[t.to_model_tool() for t in tools.values()],
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

        async def call() -> AssistantModelMessage:
            client = agent._model_client()
            out = client.create_message(request)
            if inspect.isawaitable(out):
                out = await out
            return out

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

    # ------------------------------------------------------------------------ finish

    def stop_check(self) -> _Finish | None:
        if self.signal.aborted:
            return _abort_finish(self.signal)
        if self.control.interrupted:
            return _Finish("interrupted")
        if self.turns >= self.max_turns:
            return _Finish(
                "error_max_turns",
                error=MaxTurnsError(f"reached max_turns={self.max_turns} model requests without finishing"),
            )
        return None

    async def finish(self, decision: _Finish) -> ResultMessage:
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

    async def execute_batch(self, calls: list[dict[str, Any]], *, truncated: bool) -> dict[str, Any]:
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
            self.last_outcomes = await self.batch_runner().run(calls, truncated=truncated)
            blocks = await self.finalize_results(self.last_outcomes)
            user_message = {"role": "user", "content": blocks}
            await self.agent._append(user_message)
            recorded = True
            await self.trace("user_message", {"message": user_message})
            return user_message
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
        """Run ``on_tool_result`` hooks, then trace each result; returns the blocks."""
        blocks: list[dict[str, Any]] = []
        hooks = self.hooks
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


def _abort_finish(signal: AbortSignal) -> _Finish:
    reason = signal.reason
    if isinstance(reason, BaseException):
        text = f"the query was aborted: {type(reason).__name__}: {reason}"
    elif reason is None or reason == "aborted":
        text = "the query was aborted"
    else:
        text = f"the query was aborted: {reason}"
    return _Finish("error_abort", error=AbortError(text))


def _first_error(outcomes: list[CallOutcome], blocks: list[dict[str, Any]]) -> str | None:
    for outcome, block in zip(outcomes, blocks, strict=True):
        if block.get("is_error"):
            if outcome.error is not None:
                return str(outcome.error) or type(outcome.error).__name__
            return _text_of(block.get("content")) or "tool error"
    return None


async def run_query(agent: Agent, prompt: Any, q: QueryOptions) -> AsyncIterator[SDKMessage]:
    """The query generator behind ``Agent.query`` (validated prompt and options).

    Raises :class:`ConcurrentQueryError` (on first iteration) while another query
    of the same Agent runs; hook exceptions, ``fail_on_error`` store/tracer errors
    and ``ConfigError`` for ``query(None)`` on a history that does not end with a
    user message propagate. Every other failure becomes the ``result`` event.
    """
    if agent._control is not None:
        # A query abandoned with `break` is closed by asyncio's async-generator finalizer a
        # few loop iterations later; give it that chance before calling this a conflict.
        for _ in range(4):
            await asyncio.sleep(0)
            if agent._control is None:
                break
    if agent._control is not None:
        raise ConcurrentQueryError(
            "this Agent is already running a query; one Agent holds one conversation. "
            "Await the running query first, or create another Agent for concurrent work."
        )
    control = RunControl(asyncio.get_running_loop())
    agent._control = control
    try:
        await agent._ensure_history_loaded()
        if prompt is None:
            history = agent._history
            if not history or history[-1].get("role") != "user":
                raise ConfigError(
                    "query(None) continues from the stored history, which must end with a user message"
                )
        run = _QueryRun(agent, q, control)
        run.skills = agent._skills_section(prompt)  # matched once per query, never stored
        tool_map = agent._tool_map()
        yield SystemMessage(
            session_id=run.session_id,
            model=agent.options.model,
            name=agent.name,
            tools=list(tool_map),
            stream=q.stream,
        )
        await run.trace(
            "run_start",
            {
                "model": agent.options.model,
                "tools": list(tool_map),
                "name": agent.name,
                "stream": q.stream,
                "max_turns": run.max_turns,
                "agent_session_id": agent.session_id,
            },
        )
        if prompt is not None:
            await run.add_user_message({"role": "user", "content": prompt})

        while True:
            stop = run.stop_check()
            if stop is not None:
                yield await run.finish(stop)
                return
            request = await run.build_request()

            # ---- the model call, raced against abort / interrupt / timeout
            kind: str = "done"
            payload: Any = None
            try:
                task, inbox, handles = run.start_call(request)
            except Exception as exc:  # pragma: no cover - start_call does not raise in practice
                yield await run.finish(_Finish("error", error=exc))
                return
            try:
                while True:
                    kind, payload = await inbox.get()
                    if kind == "event":
                        yield StreamEvent(session_id=run.session_id, event=payload)
                        continue
                    break
            finally:
                run.end_call(task, handles)
            if kind == "abort":
                yield await run.finish(_abort_finish(run.signal))
                return
            if kind == "interrupt":
                yield await run.finish(_Finish("interrupted"))
                return
            if kind == "timeout":
                yield await run.finish(
                    _Finish(
                        "error_timeout",
                        error=ModelTimeoutError(
                            f"the model request exceeded request_timeout_ms={run.timeout_ms} ms"
                        ),
                    )
                )
                return
            if task.cancelled():
                yield await run.finish(
                    _Finish("error", error=RuntimeError("the model request was cancelled"))
                )
                return
            exc = task.exception()
            if exc is not None:
                if not isinstance(exc, LatticeError):
                    # not one of our deliberate errors: likely a bug in a custom client -- keep the traceback
                    logger.warning(
                        "model client raised %s; the query ends with subtype 'error'",
                        type(exc).__name__,
                        exc_info=exc,
                    )
                yield await run.finish(_Finish("error", error=exc))
                return
            message = task.result()
            if not isinstance(message, AssistantModelMessage):
                yield await run.finish(
                    _Finish(
                        "error",
                        error=TypeError(
                            f"the model client returned {type(message).__name__}, not an AssistantModelMessage"
                        ),
                    )
                )
                return
            problem = _reply_problem(message)
            if problem is not None:
                # Nothing of a malformed reply enters the history: the next request stays valid.
                yield await run.finish(
                    _Finish(
                        "error", error=APIError(f"the model client returned a malformed reply: {problem}")
                    )
                )
                return
            content = message.content if message.content is not None else []

            # ---- the assistant turn
            run.usage.add(message.usage)
            run.stop_reason = message.stop_reason
            run.last_text = _text_of(content)
            wire = message.to_dict()
            wire["content"] = content
            if content:
                # An empty assistant turn is reported but not stored: the Messages API rejects it.
                await agent._append({"role": "assistant", "content": content})
            await run.trace("assistant_message", {"turn": run.turns, "message": wire})
            yield AssistantMessage(session_id=run.session_id, turn=run.turns, message=_copy(wire))

            calls = [b for b in content if b.get("type") == "tool_use"]
            if not calls:
                if run.structured:
                    yield await run.finish(
                        _Finish(
                            "error_missing_output",
                            error=MissingOutputError(
                                f"the run ended without calling {SUBMIT_OUTPUT_TOOL_NAME}; "
                                "an output_schema run must end with a valid submission"
                            ),
                        )
                    )
                else:
                    yield await run.finish(_Finish("success"))
                return

            # ---- the tool batch
            user_message = await run.execute_batch(calls, truncated=message.stop_reason == "max_tokens")
            outcomes, blocks = run.last_outcomes, user_message["content"]
            yield UserMessage(
                session_id=run.session_id,
                message=_copy(user_message),
                tool_use_result=_copy(blocks[0].get("content") if len(blocks) == 1 else blocks),
                error=_first_error(outcomes, blocks),
            )
            if run.signal.aborted:
                yield await run.finish(_abort_finish(run.signal))
                return

            ended = next((o for o in outcomes if o.result is not None and o.result.end_turn), None)

            runtime = q.runtime
            after = getattr(runtime, "after_tool_batch", None) if runtime is not None else None
            if after is not None:
                try:
                    extra = after(
                        ToolBatchOutcome(calls=calls, results=blocks, agent=agent, usage=run.usage.to_dict())
                    )
                    if inspect.isawaitable(extra):
                        extra = await extra
                except SuspendQuery:
                    yield await run.finish(_Finish("suspended"))
                    return
                for injected in extra or []:
                    if not isinstance(injected, dict) or "role" not in injected:
                        raise ConfigError(
                            f"runtime.after_tool_batch must return message dicts with a role, got {injected!r}"
                        )
                    await run.add_user_message(injected)

            if ended is not None:
                assert ended.result is not None
                if ended.call.get("name") == SUBMIT_OUTPUT_TOOL_NAME and run.structured:
                    payload = ended.result.structured_result
                    yield await run.finish(
                        _Finish("success", result=payload_text(payload), structured=payload)
                    )
                elif run.structured:
                    yield await run.finish(
                        _Finish(
                            "error_missing_output",
                            error=MissingOutputError(
                                f'tool "{ended.call.get("name")}" ended the run before {SUBMIT_OUTPUT_TOOL_NAME} '
                                "was called; an output_schema run must end with a valid submission"
                            ),
                        )
                    )
                else:
                    yield await run.finish(
                        _Finish(
                            "success",
                            result=_text_of(ended.result.content),
                            structured=ended.result.structured_result,
                        )
                    )
                return
    finally:
        agent._control = None


__all__ = ["RunControl", "SuspendQuery", "ToolBatchOutcome", "run_query"]
