"""A person's decisions on tool calls that wait: parked calls and approvals
(``docs/tool-effects.md``). The client's ``parked()`` / ``resolve()`` /
``approvals()`` / ``approve()`` / ``deny()`` and the CLI commands of the same names.

A *parked* call was interrupted by a crash and its tool's effect does not say
it is safe to run again; an *approval* is a call under
``permission_mode="by_effect"`` that needs a person's yes before it runs. Either
way the work is suspended with no worker waiting: a member's message is
``parked``, a lead's run ``suspended`` on the call.

Ids: a member's parked call is its message id; a member's approval is
``<message id>/<tool_use_id>``; a lead's parked call or approval is
``<run id>/<tool_use_id>``.

Deciding records the decision in the work's tool journal and sends the work on:
the member's message goes back to ``pending`` and its doorbell rings, or the
lead's run goes to ``resuming`` and ``lattice.resume_lead`` is sent. The work
picks the decision up when it resumes: ``result`` becomes the call's result
(the handler does not run), ``retry`` runs the call again, ``fail`` gives the
model an error result with the reason; an approval lets the call run, a
denial gives the model an error result with the reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel

from lattice_mailbox import InvalidTransitionError, MessageStatus

from .celery_config import DELIVER_TASK, RESUME_LEAD_TASK, queue_name
from .models import RunStatus
from .runstore import WaitStateError, check_run_id


class DecisionError(ValueError):
    """A decision was refused and nothing changed: an unknown id, a call that is
    not waiting (not parked, already decided), a wait of the other kind, or bad
    arguments (resolve needs exactly one of ``result``, ``retry``, ``fail``)."""


class ParkedCall(BaseModel):
    """A tool call parked for a person (``client.parked()``).

    ``message_id``: the id to resolve (a member's message id, or
    ``<run id>/<tool_use_id>`` for a lead's own call); ``member`` is ``"lead"``
    for a lead's call. ``input``: the raw input the model sent. ``reason``: why
    the runtime would not decide alone. ``created_at``: ms since the epoch.
    ``kind`` is ``"tool"`` (``lattice parked --json`` lists the work parked at a
    budget beside them: :class:`~lattice_client.budgets.BudgetWait`, kind ``"budget"``).
    """

    kind: Literal["tool"] = "tool"
    message_id: str
    run_id: str
    team: str
    member: str
    tool_name: str
    input: Any = None
    effect: str
    reason: str
    tool_use_id: str
    created_at: int = 0


class PendingApproval(BaseModel):
    """A tool call waiting for an approval (``client.approvals()``).

    ``call_id``: the id to approve or deny; ``message_id``: the member's
    message (``None`` for a lead's call). Other fields as :class:`ParkedCall`.
    """

    call_id: str
    run_id: str
    team: str
    member: str
    message_id: str | None = None
    tool_name: str
    input: Any = None
    effect: str
    reason: str
    tool_use_id: str
    created_at: int = 0


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _parked(wait: dict[str, Any]) -> ParkedCall:
    return ParkedCall(
        message_id=str(wait["id"]),
        run_id=wait["run_id"],
        team=wait["team"],
        member=wait["member"],
        tool_name=wait["tool_name"],
        input=wait.get("input"),
        effect=wait["effect"],
        reason=wait.get("reason") or "",
        tool_use_id=wait["tool_use_id"],
        created_at=int(wait.get("created_at") or 0),
    )


def _approval(wait: dict[str, Any]) -> PendingApproval:
    return PendingApproval(
        call_id=str(wait["id"]),
        run_id=wait["run_id"],
        team=wait["team"],
        member=wait["member"],
        message_id=wait.get("message_id"),
        tool_name=wait["tool_name"],
        input=wait.get("input"),
        effect=wait["effect"],
        reason=wait.get("reason") or "",
        tool_use_id=wait["tool_use_id"],
        created_at=int(wait.get("created_at") or 0),
    )


class DecisionsMixin:
    """The decisions API of :class:`~lattice_client.client.AsyncLatticeClient`
    (it gives ``runs``, ``mailbox``, ``celery`` and ``settings``)."""

    runs: Any
    mailbox: Any
    celery: Any
    settings: Any
    team_name: Callable[[str | None], Awaitable[str | None]]

    async def parked(self, team: str | None = None) -> list[ParkedCall]:
        """The parked tool calls (of ``team`` when given: its name or a reference
        a live worker serves) that can be decided now, oldest first."""
        return [_parked(w) for w in await self._open_waits("parked", team)]

    async def approvals(self, team: str | None = None) -> list[PendingApproval]:
        """The tool calls (of ``team`` when given) waiting for an approval that
        can be decided now, oldest first."""
        return [_approval(w) for w in await self._open_waits("approval", team)]

    async def _open_waits(self, kind: str, team: str | None) -> list[dict[str, Any]]:
        """The undecided waits of ``kind`` that a decision would find: a member
        stores its wait a moment before its message turns ``parked``, and a
        wait whose message is not parked (yet, or again after a crash in that
        moment) is left out, so every listed call can be decided at once.
        ``team``: a name or a reference a live worker serves (``ValueError``
        for one no live worker published)."""
        team = await self.team_name(team)
        waits = [w for w in await self.runs.waits(kind=kind) if team is None or w.get("team") == team]
        members = [w for w in waits if w.get("message_id")]
        messages = await asyncio.gather(*(self._message(str(w["message_id"])) for w in members))
        not_parked = {
            id(w)
            for w, m in zip(members, messages, strict=True)
            if m is None or m.status != MessageStatus.PARKED
        }
        return [w for w in waits if id(w) not in not_parked]

    async def resolve(
        self, message_id: str, *, result: str | None = None, retry: bool = False, fail: str | None = None
    ) -> ParkedCall:
        """Decide a parked call: exactly one of ``result`` (the call's result text:
        the call counts as done with it), ``retry=True`` (run the call again) or
        ``fail`` (the call failed with this reason; the model gets an error
        result). Sends the work on and returns the call decided.

        Raises :class:`DecisionError` (nothing changed) for no option or several,
        an empty ``fail`` reason, an unknown id, a call that is not parked
        (never was, or already resolved), or an approval id."""
        chosen = [
            name
            for name, given in (("result", result is not None), ("retry", retry), ("fail", fail is not None))
            if given
        ]
        if len(chosen) != 1:
            raise DecisionError(
                "resolve needs exactly one of result=TEXT, retry=True or fail=REASON"
                + (f" (got {', '.join(chosen)})" if chosen else " (got none)")
            )
        if result is not None and not isinstance(result, str):
            raise DecisionError(f"result must be a string, got {type(result).__name__}")
        if fail is not None and (not isinstance(fail, str) or not fail.strip()):
            raise DecisionError("fail needs a non-empty reason")
        wait, message = await self._locate(message_id, "parked")
        tool_use_id = wait["tool_use_id"]
        action = chosen[0]
        resolution = {"action": action, "text": result if action == "result" else fail, "at": _now_ms()}
        value: Any = None
        if action != "retry":
            text = result if action == "result" else f"Error: {fail}"
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_use_id, "content": text}
            if action == "fail":
                block["is_error"] = True
            value = {
                "status": "completed",
                "effect_key": wait.get("effect_key") or "",
                "started_at_ms": _now_ms(),
                "block": block,
                "end_turn": False,
                "structured_result": None,
            }
        await self._decide(wait, message, "parked", tool_use_id, value, resolution, delete=action == "retry")
        return _parked(wait)

    async def approve(self, call_id: str) -> PendingApproval:
        """Approve a call waiting for an approval: it runs when the work resumes.
        Raises :class:`DecisionError` (nothing changed) for an unknown id, a call
        not waiting for an approval (already decided), or a parked call's id."""
        return await self._approval_decision(call_id, {"behavior": "allow"})

    async def deny(self, call_id: str, reason: str) -> PendingApproval:
        """Deny a call waiting for an approval: the model gets an error result
        carrying ``reason`` (a non-empty string). Raises :class:`DecisionError`
        as :meth:`approve` does, and for an empty reason."""
        if not isinstance(reason, str) or not reason.strip():
            raise DecisionError("deny needs a non-empty reason")
        return await self._approval_decision(call_id, {"behavior": "deny", "message": reason})

    # -- shared ---------------------------------------------------------------------------------

    async def _approval_decision(self, call_id: str, decision: dict[str, Any]) -> PendingApproval:
        wait, message = await self._locate(call_id, "approval")
        tool_use_id = wait["tool_use_id"]
        resolution = {"action": decision["behavior"], "text": decision.get("message"), "at": _now_ms()}
        await self._decide(wait, message, "approval", f"approval:{tool_use_id}", decision, resolution)
        return _approval(wait)

    async def _locate(self, wait_id: str, kind: str) -> tuple[dict[str, Any], Any]:
        """The wait ``wait_id`` of ``kind`` and (for a member's) its message, or
        :class:`DecisionError` saying why there is none."""
        if not isinstance(wait_id, str) or not wait_id.strip():
            raise DecisionError(f"an id is needed, got {wait_id!r}")
        owner, _, tool_use_id = wait_id.partition("/")
        message = await self._message(owner)
        if message is not None:
            run_id = message.metadata.get("run_id")
            if not isinstance(run_id, str) or not run_id:
                raise DecisionError(f"message {owner} belongs to no distributed run: nothing waits on it")
        else:
            if not tool_use_id:
                raise DecisionError(
                    f"unknown id {wait_id!r}: no such message (a lead's call id is RUN_ID/TOOL_USE_ID)"
                )
            try:
                run_id = check_run_id(owner)
            except ValueError:
                raise DecisionError(f"unknown id {wait_id!r}: no such message or run") from None
            if await self.runs.status(run_id) is None:
                raise DecisionError(f"unknown id {wait_id!r}: no such message or run")
        wait = await self.runs.get_wait(run_id, wait_id)
        other = "approval" if kind == "parked" else "parked"
        # a member's decided wait stays until its next claim; a lead's closes when decided
        if wait is None or (wait.get("resolution") is not None and message is None):
            if message is not None and message.status == MessageStatus.PARKED:
                if await self.runs.status(run_id) == RunStatus.BUDGET_REACHED:
                    raise DecisionError(
                        f"{wait_id} is parked at run {run_id}'s token budget, not on a call: "
                        f"raising the budget resumes it (lattice budget {run_id} --tokens N)"
                    )
            status = f" (status {message.status.value})" if message is not None else ""
            what = "a parked call" if kind == "parked" else "a call waiting for an approval"
            raise DecisionError(f"{wait_id} is not {what}{status}: nothing waits on it now")
        if wait.get("kind") != kind:
            hint = "use resolve" if other == "parked" else "use approve / deny"
            raise DecisionError(
                f"{wait_id} is {'a parked call' if other == 'parked' else 'waiting for an approval'}: {hint}"
            )
        if message is not None and message.status != MessageStatus.PARKED:
            raise DecisionError(
                f"{wait_id} is not waiting (message {message.id} is {message.status.value}): "
                "it was decided already, or the work has not stopped on it yet"
            )
        return wait, message

    async def _message(self, message_id: str) -> Any:
        try:
            return await self.mailbox.get(message_id)
        except (TypeError, ValueError):
            return None

    async def _decide(
        self,
        wait: dict[str, Any],
        message: Any,
        kind: str,
        field: str,
        value: Any,
        resolution: dict[str, Any],
        *,
        delete: bool = False,
    ) -> None:
        run_id = wait["run_id"]
        journal_key = (
            self.runs.item_journal_key(run_id, wait["work_item_id"])
            if message is not None
            else self.runs.tools_key(run_id)
        )
        try:
            recorded, stored = await self.runs.resolve_wait(
                run_id,
                wait["id"],
                kind=kind,
                journal_key=journal_key,
                field=field,
                value=value,
                delete=delete,
                resolution=resolution,
            )
        except WaitStateError as exc:
            raise DecisionError(f"{wait['id']} is not waiting: {exc}") from None
        if not recorded:  # decided before, but its message is still parked: finish that decision
            earlier = stored.get("resolution") or {}
            if (earlier.get("action"), earlier.get("text")) != (resolution["action"], resolution["text"]):
                raise DecisionError(
                    f"{wait['id']} was decided already ({earlier.get('action')}); nothing changed"
                )
        prefix = self.settings.key_prefix
        if message is not None:
            try:  # only while still parked: never release a claim taken since it was read
                await self.mailbox.update_status(
                    message.id, MessageStatus.PENDING, only_from=MessageStatus.PARKED
                )
            except InvalidTransitionError:
                return  # a concurrent decision moved it on already (and rang its doorbell)
            task, args, queue = DELIVER_TASK, [message.to], queue_name(prefix, wait["team"], wait["member"])
        else:
            task, args, queue = RESUME_LEAD_TASK, [run_id], queue_name(prefix, wait["team"])
        await asyncio.to_thread(self.celery.send_task, task, args=args, queue=queue)


class SyncDecisionsMixin:
    """The blocking form of :class:`DecisionsMixin` for :class:`~lattice_client.client.LatticeClient`."""

    aio: Any

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError  # LatticeClient's runs it on its loop thread

    def parked(self, team: str | None = None) -> list[ParkedCall]:
        """See :meth:`DecisionsMixin.parked`."""
        return self._call(self.aio.parked, team)

    def approvals(self, team: str | None = None) -> list[PendingApproval]:
        """See :meth:`DecisionsMixin.approvals`."""
        return self._call(self.aio.approvals, team)

    def resolve(
        self, message_id: str, *, result: str | None = None, retry: bool = False, fail: str | None = None
    ) -> ParkedCall:
        """See :meth:`DecisionsMixin.resolve`."""
        return self._call(self.aio.resolve, message_id, result=result, retry=retry, fail=fail)

    def approve(self, call_id: str) -> PendingApproval:
        """See :meth:`DecisionsMixin.approve`."""
        return self._call(self.aio.approve, call_id)

    def deny(self, call_id: str, reason: str) -> PendingApproval:
        """See :meth:`DecisionsMixin.deny`."""
        return self._call(self.aio.deny, call_id, reason)


__all__ = ["DecisionError", "DecisionsMixin", "ParkedCall", "PendingApproval", "SyncDecisionsMixin"]
