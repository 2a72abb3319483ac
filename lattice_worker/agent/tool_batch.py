"""Execution of one tool batch (all ``tool_use`` blocks of one assistant turn).

Concurrency and approvals: docs/tool-effects.md ("How concurrency fits together",
"Approvals by effect").

Order of checks, batch level first (each rejects the whole batch, no handler runs):

1. the response was cut at ``max_tokens`` -> every call gets an error asking for
   a shorter reissue;
2. ``output_schema`` is set and ``submit_output`` is mixed with other calls or
   submitted twice -> code ``submit_output_exclusive_batch``;
3. ``tool_batch_policy`` rejects (its code) or raises (``tool_batch_policy_error``).

Then per call, in scheduling order: unknown tool name -> error; input the
model sent that was not a JSON object (invalid JSON, say: the loop passes these
as ``invalid_inputs``) -> error quoting the problem, no permission check; a deferred
tool not loaded yet -> error (search first); a call the runtime's journal
recorded ``completed`` -> its recorded result, nothing runs; the permission /
approval step (:mod:`.approvals`: raw input, before parsing; deny -> the
message; not asked for the built-in ``submit_output``) -> error; input parsing
(not an object / invalid) -> error; a call the journal recorded ``started``
(interrupted by a crash) -> decided by its effect
(:func:`~lattice_worker.tools.recovery.decide_recovery`: run again, use a found
value, or park); handler (exception -> ``"Error: ..."`` error, a
``CancelledError`` included unless the query itself is being cancelled; a
``ToolResult(is_error=True)`` -> error with its content as-is). Calls that
have not started when the query's signal is aborted get an "aborted" error
and never run; handlers that started are awaited to completion. Results
always come back in ``tool_use`` order.

Scheduling (:mod:`.tool_schedule`): consecutive calls that may overlap run
together -- a ``concurrent`` tool (at most 8 in flight), or under
``tool_concurrency`` mode ``"safe"`` a tool whose ``is_concurrency_safe(input)``
is true, or every call in mode ``"all"`` (at most ``max_concurrency`` in
flight) -- and any other call runs alone: it starts after every earlier call
is recorded, and nothing starts until it finishes. Under
``permission_mode="by_effect"`` a call that needs an approval always runs alone.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import AbortError, ToolBatchRejectedError, ToolExecutionError
from ..tools.effects import effect_key
from ..tools.recovery import JournalCall, JournalRecord, decide_recovery
from ..tools.tool import ToolContext, ToolDefinition, ToolInputError, ToolResult, content_text
from .abort import AbortSignal
from .approvals import PermissionRequest, check_call, is_runtime_tool, needs_approval
from .options import ToolConcurrencyOptions
from .output import SUBMIT_OUTPUT_TOOL_NAME
from .suspend import SuspendQuery
from .tool_schedule import MAX_CONCURRENT_CALLS, run_in_call_order

TRUNCATED_MESSAGE = (
    "This tool call was not run: your response was cut off at the max_tokens limit, so its input may "
    "be incomplete. Reissue the call with shorter output (for example split a large input across "
    "several calls)."
)


@dataclass
class ToolBatchPolicyContext:
    """What ``tool_batch_policy`` receives.

    ``tool_calls`` is ``[{"id", "name", "input", "kind": "tool" | "agent_tool"}]`` in
    tool_use order; ``signal`` the query's abort signal; ``agent`` and ``runtime``
    the running Agent and the query's runtime (or ``None``).
    """

    tool_calls: list[dict[str, Any]]
    signal: AbortSignal | None = None
    agent: Any = None
    runtime: Any = None


@dataclass
class CallOutcome:
    """One call's outcome: the ``tool_use`` block, the ``tool_result`` block, the
    error (exception) when it failed, and the handler's :class:`ToolResult` on success.
    ``ends_turn``: the call succeeded and ends the turn (its result's ``end_turn``,
    or its tool's ``ends_turn``)."""

    call: dict[str, Any]
    block: dict[str, Any]
    error: BaseException | None = None
    result: ToolResult | None = None
    started: bool = False
    ends_turn: bool = False


@dataclass
class _Prepared:
    index: int
    call: dict[str, Any]
    tool: ToolDefinition | None
    parsed: Any = None
    parse_error: ToolInputError | None = None
    invalid: str | None = None
    safe: bool = False
    cap: int = 1
    outcome: CallOutcome | None = field(default=None, repr=False)


def _error_block(tool_use_id: str, content: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content, "is_error": True}


def _fail(call: dict[str, Any], error: BaseException, content: str | None = None) -> CallOutcome:
    text = content if content is not None else f"Error: {error}"
    return CallOutcome(call=call, block=_error_block(str(call.get("id", "")), text), error=error)


def _being_cancelled() -> bool:
    """True when the running task has a pending ``cancel()`` -- as opposed to a
    handler that raised ``CancelledError`` on its own (say, it awaited a future
    somebody else cancelled), which is just a failed call."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _rejection_content(code: str, message: str, extra: dict[str, Any] | None = None) -> str:
    body: dict[str, Any] = {"error": {"code": code, "message": message}}
    if extra:
        body["error"].update(extra)
    return json.dumps(body, ensure_ascii=False)


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


class ToolBatchRunner:
    """Runs batches for one query; built by the loop with the agent's settings."""

    def __init__(
        self,
        *,
        tools: dict[str, ToolDefinition],
        concurrency: ToolConcurrencyOptions,
        permission: Callable[[PermissionRequest], Any] | None,
        policy: Any,
        structured: bool,
        signal: AbortSignal,
        runtime: Any,
        agent: Any,
    ) -> None:
        self.tools = tools
        self.concurrency = concurrency
        self.permission = permission
        self.policy = policy
        self.structured = structured
        self.signal = signal
        self.runtime = runtime
        self.agent = agent
        options = getattr(agent, "options", None)
        self.permission_mode = getattr(options, "permission_mode", "allow")
        self.deferred = getattr(agent, "deferred_tools", None)
        self.journal = getattr(runtime, "tool_journal", None) if runtime is not None else None
        scope = getattr(runtime, "effect_scope", None) if runtime is not None else None
        self.scope = str(scope or getattr(agent, "session_id", None) or "lattice")

    # ----------------------------------------------------------------- batch checks

    def _truncated(self, calls: list[dict[str, Any]]) -> list[CallOutcome]:
        return [_fail(c, ToolExecutionError(TRUNCATED_MESSAGE), f"Error: {TRUNCATED_MESSAGE}") for c in calls]

    def _reject_all(
        self, calls: list[dict[str, Any]], code: str, message: str, extra: dict[str, Any] | None = None
    ) -> list[CallOutcome]:
        content = _rejection_content(code, message, extra)
        return [_fail(c, ToolBatchRejectedError(message, code=code), content) for c in calls]

    def _exclusive_submit(self, calls: list[dict[str, Any]]) -> list[CallOutcome] | None:
        if not self.structured or len(calls) < 2:
            return None
        submits = [c for c in calls if c.get("name") == SUBMIT_OUTPUT_TOOL_NAME]
        if not submits:
            return None
        message = (
            f"{SUBMIT_OUTPUT_TOOL_NAME} must be the only tool call in its response "
            f"(this response had {len(calls)} calls, {len(submits)} of them {SUBMIT_OUTPUT_TOOL_NAME}). "
            f"Finish the other work first, then call {SUBMIT_OUTPUT_TOOL_NAME} alone, once."
        )
        return self._reject_all(calls, "submit_output_exclusive_batch", message)

    async def _apply_policy(self, calls: list[dict[str, Any]]) -> list[CallOutcome] | None:
        if self.policy is None:
            return None
        ctx = ToolBatchPolicyContext(
            tool_calls=[
                {
                    "id": c.get("id"),
                    "name": c.get("name"),
                    "input": c.get("input"),
                    "kind": (self.tools[c["name"]].kind if c.get("name") in self.tools else "tool"),
                }
                for c in calls
            ],
            signal=self.signal,
            agent=self.agent,
            runtime=self.runtime,
        )
        validate = getattr(self.policy, "validate", None)
        fn = validate if callable(validate) else self.policy
        try:
            decision = await _maybe_await(fn(ctx))
            allowed, code, message, extra = _read_decision(decision)
        except Exception as exc:
            return self._reject_all(
                calls,
                "tool_batch_policy_error",
                f"tool_batch_policy failed ({type(exc).__name__}: {exc}); no tool of this batch was run",
            )
        if allowed:
            return None
        return self._reject_all(calls, code, message, extra)

    # ------------------------------------------------------------------- execution

    def _prepare(self, index: int, call: dict[str, Any], invalid: str | None = None) -> _Prepared:
        definition = self.tools.get(call.get("name", ""))
        prep = _Prepared(index=index, call=call, tool=definition, invalid=invalid)
        if definition is None or invalid is not None:
            return prep
        try:
            prep.parsed = definition.parse_input(call.get("input"))
        except ToolInputError as exc:
            prep.parse_error = exc
            return prep
        mode = self.concurrency.mode
        if self.permission_mode == "by_effect" and needs_approval(definition):
            return prep  # an approval may suspend the query: such a call runs alone
        prep.safe = mode == "all" or (mode == "safe" and definition.check_concurrency_safe(prep.parsed))
        limit = self.concurrency.max_concurrency
        prep.cap = min(limit, MAX_CONCURRENT_CALLS) if definition.concurrent else limit
        return prep

    async def _run_one(self, prep: _Prepared) -> CallOutcome:
        call = prep.call
        tool_use_id = str(call.get("id", ""))
        name = call.get("name")
        if self.signal.aborted:
            return _fail(call, AbortError("tool call not started: the query was aborted"))
        definition = prep.tool
        if definition is None:
            available = ", ".join(sorted(self.tools)) or "(none)"
            return _fail(call, ToolExecutionError(f'unknown tool "{name}". Available tools: {available}.'))
        if prep.invalid is not None:
            return _fail(
                call,
                ToolInputError(
                    f'tool "{name}" was not run: {prep.invalid}. Reissue the call with its input as one '
                    "valid JSON object."
                ),
            )
        if self.deferred is not None and self.deferred.is_hidden(definition.name):
            text = self.deferred.hidden_error(definition.name)
            return _fail(call, ToolExecutionError(text), f"Error: {text}")
        key = effect_key(self.scope, tool_use_id)
        # the runtime's own tools (team tools, member calls, tool_search) are made safe by the runtime
        journal = (
            self.journal if not is_runtime_tool(definition) and name != SUBMIT_OUTPUT_TOOL_NAME else None
        )
        entry = JournalCall(tool_use_id, definition.name, call.get("input"), definition.effect, key)
        record = await journal.entry(entry) if journal is not None else None
        if record is not None:
            key = entry.effect_key = record.effect_key or key
            if record.status == "completed" and record.block is not None:
                return _replayed(call, definition, record)
        request = PermissionRequest(name, call.get("input"), tool_use_id, definition.effect, key)
        denied = await check_call(
            definition,
            request,
            mode=self.permission_mode,
            permission=self.permission,
            runtime=self.runtime,
            exempt=name == SUBMIT_OUTPUT_TOOL_NAME,
        )
        if denied is not None:
            return _fail(call, ToolExecutionError(denied), denied)
        if prep.parse_error is not None:
            return _fail(call, prep.parse_error)
        if record is not None and journal is not None:
            decision = await decide_recovery(definition, record, effect_key=key, now_ms=_now_ms())
            if decision.action == "park":
                await journal.park(entry, decision.reason)
                raise SuspendQuery(f'tool call {tool_use_id} ("{definition.name}") parked: {decision.reason}')
            if decision.action == "use":
                assert decision.result is not None
                outcome = _succeeded(call, definition, decision.result)
                await journal.completed(entry, _completed_record(entry, record.started_at_ms, outcome))
                return outcome
        started_at = record.started_at_ms if record is not None else _now_ms()
        if journal is not None:
            await journal.started(entry)
        outcome = await self._invoke(prep, definition, key)
        if journal is not None and outcome.started:
            await journal.completed(entry, _completed_record(entry, started_at, outcome))
        return outcome

    async def _invoke(self, prep: _Prepared, definition: ToolDefinition, key: str) -> CallOutcome:
        call = prep.call
        tool_use_id = str(call.get("id", ""))
        ctx = ToolContext(
            tool_use_id=tool_use_id,
            tool_name=definition.name,
            signal=self.signal,
            runtime=self.runtime,
            agent=self.agent,
            effect_key=key,
        )
        try:
            result = await definition.invoke(prep.parsed, ctx)
        except (Exception, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError) and _being_cancelled():
                raise  # the query itself is being cancelled: let it unwind
            if isinstance(exc, ToolExecutionError) and exc.__class__ is ToolExecutionError:
                text = f"Error: {exc}"
            else:
                text = f'Error: tool "{definition.name}" failed: {type(exc).__name__}: {exc}'
            outcome = _fail(call, exc, text)
            outcome.started = True
            return outcome
        return _succeeded(call, definition, result)

    async def run(
        self,
        calls: list[dict[str, Any]],
        *,
        truncated: bool = False,
        invalid_inputs: dict[str, str] | None = None,
    ) -> list[CallOutcome]:
        """Run one batch; returns one :class:`CallOutcome` per call, in ``calls`` order.

        ``invalid_inputs``: ``tool_use`` id -> why the model's input could not be
        used (those calls get an error result and never run). Never raises for
        tool failures (they become error outcomes). Raises :class:`SuspendQuery`
        when a call waits for an approval or was parked (the calls that already
        started are settled first).
        """
        if truncated:
            return self._truncated(calls)
        rejected = self._exclusive_submit(calls)
        if rejected is None:
            rejected = await self._apply_policy(calls)
        if rejected is not None:
            return rejected
        invalid = invalid_inputs or {}
        prepared = [self._prepare(i, c, invalid.get(str(c.get("id")))) for i, c in enumerate(calls)]
        group: list[_Prepared] = []
        for prep in prepared:
            if prep.safe:
                group.append(prep)
                continue
            if group:
                await self._run_group(group)
                group = []
            prep.outcome = await self._run_one(prep)
        if group:
            await self._run_group(group)
        return [p.outcome for p in prepared if p.outcome is not None]

    async def _run_group(self, group: list[_Prepared]) -> None:
        def record(i: int, outcome: CallOutcome) -> None:
            group[i].outcome = outcome

        await run_in_call_order(len(group), lambda i: group[i].cap, lambda i: self._run_one(group[i]), record)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _succeeded(call: dict[str, Any], definition: ToolDefinition, result: ToolResult) -> CallOutcome:
    tool_use_id = str(call.get("id", ""))
    if result.is_error:
        # The handler chose its error text: used as-is (no "Error: " prefix), never ends the turn.
        block = {
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": result.content,
            "is_error": True,
        }
        message = content_text(result.content) or f'tool "{definition.name}" returned an error result'
        return CallOutcome(call=call, block=block, error=ToolExecutionError(message), started=True)
    block = {"type": "tool_result", "tool_use_id": tool_use_id, "content": result.content}
    ends = result.end_turn or definition.ends_turn
    return CallOutcome(call=call, block=block, result=result, started=True, ends_turn=ends)


def _completed_record(entry: JournalCall, started_at_ms: int, outcome: CallOutcome) -> JournalRecord:
    result = outcome.result
    return JournalRecord(
        tool_use_id=entry.tool_use_id,
        status="completed",
        effect_key=entry.effect_key,
        started_at_ms=started_at_ms,
        block=outcome.block,
        end_turn=bool(result is not None and result.end_turn),
        structured_result=result.structured_result if result is not None else None,
    )


def _replayed(call: dict[str, Any], definition: ToolDefinition, record: JournalRecord) -> CallOutcome:
    """The outcome of a call the journal recorded ``completed``: its result, not run again."""
    block = dict(record.block or {})
    block["tool_use_id"] = str(call.get("id", ""))
    content = block.get("content", "")
    if block.get("is_error"):
        text = content_text(content) if isinstance(content, str | list) else str(content)
        return CallOutcome(call=call, block=block, error=ToolExecutionError(text), started=True)
    result = ToolResult(content=content, end_turn=record.end_turn, structured_result=record.structured_result)
    ends = record.end_turn or definition.ends_turn
    return CallOutcome(call=call, block=block, result=result, started=True, ends_turn=ends)


def _read_decision(decision: Any) -> tuple[bool, str, str, dict[str, Any]]:
    def get(key: str) -> Any:
        return decision.get(key) if isinstance(decision, dict) else getattr(decision, key, None)

    if decision is None or not (isinstance(decision, dict) or hasattr(decision, "allowed")):
        raise TypeError(f"the policy returned {decision!r}, not {{'allowed': bool, ...}}")
    allowed = get("allowed")
    if not isinstance(allowed, bool):
        raise TypeError(f"the policy result's 'allowed' is {allowed!r}, not a bool")
    if allowed:
        return True, "", "", {}
    code = get("code") or "invalid_tool_batch"
    message = get("message") or "The tool batch was rejected by the tool_batch_policy."
    extra: dict[str, Any] = {}
    for key in ("conflicting_tool_call_ids", "suggested_next_step"):
        value = get(key)
        if value is not None:
            extra[key] = value
    return False, str(code), str(message), extra


__all__ = [
    "TRUNCATED_MESSAGE",
    "CallOutcome",
    "PermissionRequest",
    "ToolBatchPolicyContext",
    "ToolBatchRunner",
]
