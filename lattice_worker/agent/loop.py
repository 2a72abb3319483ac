"""The agent loop: one query of one Agent (docs/architecture.md, "Core model").

For each query: load the history store once (first query only), yield the
``system`` event, add the prompt to the history (never echoed as an event),
then repeat -- model request (racing the abort signal, ``interrupt()`` and
``request_timeout_ms``), ``assistant`` event, tool batch, ``user`` event, the
runtime's ``after_tool_batch`` -- until the model stops calling tools, a tool
ends the turn, ``submit_output`` succeeds, or a limit ends it; then exactly one
``result`` event. Events are produced lazily (the loop advances when the
consumer asks for the next one); raw stream events of the model call in flight
are buffered meanwhile, never dropped or reordered.

Rules every turn follows: each request's messages are normalised
(:mod:`.normalize`) after the ``on_model_request`` hook; a ``tool_use`` whose
input is not a JSON object is stored with ``{}`` and answered with an error
result; each tool result is bounded (:mod:`.result_limits`); with
``auto_compact`` the history is compacted between turns and once per query
after an overflow (:mod:`.compaction`), the overflowed turn then retried. One
query at a time per Agent, across threads and event loops (its lock).

Seams for the team and distributed runtimes (docs/contracts.md): the query
option ``runtime`` (``async after_tool_batch(outcome) -> list[message] | None``,
may raise :class:`SuspendQuery`; a model client may raise it too, before its call
reaches the provider: the distributed runtime's rate limiter, whose call waits
for its turn), ``ToolContext.runtime``, ``Agent.query(None)`` and the
``trace_context`` option.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import (
    APIError,
    ConcurrentQueryError,
    ConfigError,
    LatticeError,
    MissingOutputError,
    ModelTimeoutError,
)
from .compaction import context_tokens, is_overflow_error
from .events import AssistantMessage, SDKMessage, StreamEvent, SystemMessage, UserMessage
from .model import AssistantModelMessage, TokenUsage
from .normalize import coerce_tool_input
from .options import QueryOptions
from .output import SUBMIT_OUTPUT_TOOL_NAME, payload_text
from .query_run import Finish, LoopAgent, QueryRun, RunControl, abort_finish, text_of
from .query_run import copy_json as _copy
from .suspend import SuspendQuery
from .tool_batch import CallOutcome

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


logger = logging.getLogger("lattice_worker.agent")


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


def _object_inputs(content: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """``content`` with every ``tool_use`` input an object (what is stored and
    sent back), and ``tool_use`` id -> problem for the inputs that were not one
    (invalid JSON...): those calls are answered with an error result."""
    invalid: dict[str, str] = {}
    fixed: list[dict[str, Any]] | None = None
    for i, block in enumerate(content):
        if block.get("type") == "tool_use" and not isinstance(block.get("input"), dict):
            value, problem = coerce_tool_input(block.get("input"))
            if fixed is None:
                fixed = list(content)
            fixed[i] = {**block, "input": value}
            if problem is not None:
                invalid[str(block.get("id"))] = problem
    return (fixed if fixed is not None else content), invalid


def _window_error(run: QueryRun, already_compacted: bool) -> APIError:
    text = (
        "the model's context window ran out during the request (stop reason "
        "model_context_window_exceeded); the response was discarded"
    )
    if run.compaction is None:
        text += ". Set auto_compact=True to compact the history and retry the turn"
    elif already_compacted:
        text += ", and the history was already compacted once in this query"
    else:
        text += ", and compacting the history was not possible (see the lattice_worker.agent log)"
    return APIError(text)


def _first_error(outcomes: list[CallOutcome], blocks: list[dict[str, Any]]) -> str | None:
    for outcome, block in zip(outcomes, blocks, strict=True):
        if block.get("is_error"):
            if outcome.error is not None:
                return str(outcome.error) or type(outcome.error).__name__
            return text_of(block.get("content")) or "tool error"
    return None


async def run_query(agent: LoopAgent, prompt: Any, q: QueryOptions) -> AsyncIterator[SDKMessage]:
    """The query generator behind ``Agent.query`` (validated prompt and options).

    Raises :class:`ConcurrentQueryError` (on first iteration) while another query
    of the same Agent runs; hook exceptions, ``fail_on_error`` store/tracer errors
    and ``ConfigError`` for ``query(None)`` on a history that does not end with a
    user message propagate, as does a ``ConfigError`` for a query
    ``thinking_config`` whose budget, capped at ``max_tokens - 1``, is below
    1,024 tokens. Every other failure becomes the ``result`` event.

    The one-query-at-a-time guard is the Agent's ``threading.Lock``, taken
    without blocking: it holds across threads and event loops.
    """
    lock = agent._query_lock
    if not lock.acquire(blocking=False):
        # A query abandoned with `break` is closed by asyncio's async-generator finalizer a
        # few loop iterations later; give it that chance before calling this a conflict.
        for _ in range(4):
            await asyncio.sleep(0)
            if lock.acquire(blocking=False):
                break
        else:
            raise ConcurrentQueryError(
                "this Agent is already running a query; one Agent holds one conversation. "
                "Await the running query first, or create another Agent for concurrent work."
            )
    control = RunControl(asyncio.get_running_loop())
    agent._control = control
    try:
        await agent._ensure_history_loaded()
        await agent._prepare_mcp_tools()
        if prompt is None:
            history = agent._history
            if not history or history[-1].get("role") != "user":
                raise ConfigError(
                    "query(None) continues from the stored history, which must end with a user message"
                )
        run = QueryRun(agent, q, control)
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

        # The last response of an earlier query may have been past the threshold: compact
        # before this query's first request. Later turns compact after their tool batch.
        compacted = await run.compact("threshold")
        if compacted is not None:
            yield compacted
        retry = False  # the next request retries the same turn (after an overflow recovery)
        while True:
            stop = run.stop_check(retry=retry)
            if stop is not None:
                yield await run.finish(stop)
                return
            request = await run.build_request(retry=retry)
            retry = False

            # ---- the model call, raced against abort / interrupt / timeout
            kind: str = "done"
            payload: Any = None
            try:
                task, inbox, handles = run.start_call(request)
            except Exception as exc:  # pragma: no cover - start_call does not raise in practice
                yield await run.finish(Finish("error", error=exc))
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
                yield await run.finish(abort_finish(run.signal))
                return
            if kind == "interrupt":
                yield await run.finish(Finish("interrupted"))
                return
            if kind == "timeout":
                yield await run.finish(
                    Finish(
                        "error_timeout",
                        error=ModelTimeoutError(
                            f"the model request exceeded request_timeout_ms={run.timeout_ms} ms"
                        ),
                    )
                )
                return
            if task.cancelled():
                yield await run.finish(Finish("error", error=RuntimeError("the model request was cancelled")))
                return
            exc = task.exception()
            if isinstance(exc, SuspendQuery):  # the runtime ends the query before the call (budget, turn)
                yield await run.finish(Finish("suspended"))
                return
            message = task.result() if exc is None else None
            window = (  # the window ran out mid-response: the reply is unusable and never stored
                isinstance(message, AssistantModelMessage)
                and message.stop_reason == "model_context_window_exceeded"
                and _reply_problem(message) is None
            )
            if window or (exc is not None and is_overflow_error(exc)):
                if window:
                    assert message is not None
                    run.usage.add(message.usage)
                    run.stop_reason = message.stop_reason
                already = run.recovered
                compacted = await run.compact("overflow")
                if compacted is not None:
                    yield compacted
                    retry = True  # the same turn again, from the compacted history
                    continue
                stop = run.stop_check(retry=True)  # aborted or interrupted while summarising
                if stop is not None:
                    yield await run.finish(stop)
                    return
                if window:
                    yield await run.finish(Finish("error", error=_window_error(run, already)))
                    return
            if exc is not None:
                if not isinstance(exc, LatticeError):
                    # not one of our deliberate errors: likely a bug in a custom client -- keep the traceback
                    logger.warning(
                        "model client raised %s; the query ends with subtype 'error'",
                        type(exc).__name__,
                        exc_info=exc,
                    )
                yield await run.finish(Finish("error", error=exc))
                return
            if not isinstance(message, AssistantModelMessage):
                yield await run.finish(
                    Finish(
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
                    Finish("error", error=APIError(f"the model client returned a malformed reply: {problem}"))
                )
                return
            content, invalid = _object_inputs(message.content if message.content is not None else [])

            # ---- the assistant turn
            run.usage.add(message.usage)
            agent._context_tokens = context_tokens(message.usage)
            run.stop_reason = message.stop_reason
            run.last_text = text_of(content)
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
                        Finish(
                            "error_missing_output",
                            error=MissingOutputError(
                                f"the run ended without calling {SUBMIT_OUTPUT_TOOL_NAME}; "
                                "an output_schema run must end with a valid submission"
                            ),
                        )
                    )
                else:
                    yield await run.finish(Finish("success"))
                return

            # ---- the tool batch
            try:
                user_message = await run.execute_batch(
                    calls, truncated=message.stop_reason == "max_tokens", invalid=invalid
                )
            except SuspendQuery:  # a call waits for a person (docs/contracts.md)
                yield await run.finish(Finish("suspended"))
                return
            outcomes, blocks = run.last_outcomes, user_message["content"]
            yield UserMessage(
                session_id=run.session_id,
                message=_copy(user_message),
                tool_use_result=_copy(blocks[0].get("content") if len(blocks) == 1 else blocks),
                error=_first_error(outcomes, blocks),
            )
            if run.signal.aborted:
                yield await run.finish(abort_finish(run.signal))
                return

            ended = next((o for o in outcomes if o.ends_turn), None)
            if ended is None:
                # Between turns: compact now, before the runtime may suspend the query (the
                # distributed lead resumes in another segment, from the compacted history).
                compacted = await run.compact("threshold")
                if compacted is not None:
                    yield compacted

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
                    yield await run.finish(Finish("suspended"))
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
                        Finish("success", result=payload_text(payload), structured=payload)
                    )
                elif run.structured:
                    yield await run.finish(
                        Finish(
                            "error_missing_output",
                            error=MissingOutputError(
                                f'tool "{ended.call.get("name")}" ended the run before {SUBMIT_OUTPUT_TOOL_NAME} '
                                "was called; an output_schema run must end with a valid submission"
                            ),
                        )
                    )
                elif ended.result.end_turn:
                    yield await run.finish(
                        Finish(
                            "success",
                            result=text_of(ended.result.content),
                            structured=ended.result.structured_result,
                        )
                    )
                else:  # an ends_turn tool: the run's result is the model's last text
                    yield await run.finish(Finish("success"))
                return
    finally:
        agent._control = None
        lock.release()


__all__ = ["RunControl", "SuspendQuery", "ToolBatchOutcome", "run_query"]
