"""What the team mailbox tools act on during one agent run: :class:`MailboxToolState`.

One state per agent run (a member working on one mailbox message, or a lead
created with ``expose_lead_mailbox_tools=True``): who is calling, which message
it works on, and the mailbox operations the tools of
:mod:`lattice_worker.team.member_tools` call (send, reply, follow-up, read,
status), each emitting its :class:`~lattice_worker.team.events.TeamMessageEvent`.
Also :func:`set_message_status` and :func:`emit_event`, which the member step
and the team runner use outside the tools.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from lattice_mailbox.base import ClaimError, InvalidTransitionError, MessageTooLargeError, TeamMailbox
from lattice_mailbox.message import MessageStatus, TeamMessage
from lattice_mailbox.validation import CheckedSend, Outgoing, check_send

from ..errors import ToolExecutionError
from .events import TeamMessageEvent
from .ids import LEAD, mailbox_id

logger = logging.getLogger("lattice_worker.team")

EmitFn = Callable[[Any], Awaitable[None] | None]


TeamToolError = ToolExecutionError
"""What team tools raise to refuse a call (bad recipient, foreign message...):
the loop turns a plain ``ToolExecutionError`` into an error ``tool_result``
reading ``"Error: <message>"``; nothing was changed."""


class UpstreamTooLargeError(TeamToolError):
    """A reply / follow-up the store would reject for its size; refused before
    anything changed. ``detail`` is the store's size message."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


async def emit_event(emit: EmitFn | None, event: Any) -> None:
    """Call ``emit(event)`` (sync or async) when an emitter is set.

    Event delivery is observational: an emitter that raises is logged on the
    ``lattice_worker.team`` logger and the run goes on (it must not turn into a
    member failure)."""
    if emit is None:
        return
    try:
        value = emit(event)
        if inspect.isawaitable(value):
            await value
    except Exception:
        logger.warning(
            "team event callback failed on a %s event; continuing", getattr(event, "type", "?"), exc_info=True
        )


async def set_message_status(
    mailbox: TeamMailbox, message_id: str, status: MessageStatus | str, token: str | None
) -> None:
    """Finish (or open) a message: fenced ``complete`` when ``token`` is given,
    else ``update_status``. Raises :class:`~lattice_mailbox.base.ClaimError`
    when the claim was lost, :class:`InvalidTransitionError` when the message
    already left the state the caller expected, ``LookupError`` when it is gone."""
    if token is not None:
        # a store's finish_claim is its complete without building the message it returns
        finish = getattr(mailbox, "finish_claim", None) or mailbox.complete  # type: ignore[attr-defined]
        await finish(message_id, token, status)
        return
    if not await mailbox.update_status(message_id, status):
        raise LookupError(f"message {message_id} not found in the mailbox")


@dataclass
class MailboxToolState:
    """What the mailbox tools act on during one agent run.

    Attributes:
        team_name: the team's name (mailbox ids are ``"<team>::<name>"``).
        self_name: the calling member's name, or ``"lead"``.
        member_names: names a ``team_send`` may address (``"lead"`` is always allowed).
        mailbox: the team's store.
        current: the message this run was started for (claimed, ``processing``), or
            ``None`` (the lead).
        token: the claim token of ``current`` for fenced completion, or ``None``.
        emit: receives :class:`TeamMessageEvent` for ``sent`` / ``reply`` /
            ``followup`` / ``done``.
        replies: message id -> the upstream reply that closed it (filled by ``team_reply``).
        followups: upstream progress messages sent by ``team_followup``, in order.
        opened: ids this run opened with ``team_read``.
        claim_lost: set when a fenced completion of ``current`` was refused
            (another worker owns the claim now); the run must write nothing more.
    """

    team_name: str
    self_name: str
    member_names: list[str]
    mailbox: TeamMailbox
    current: TeamMessage | None = None
    token: str | None = None
    emit: EmitFn | None = None
    replies: dict[str, TeamMessage] = field(default_factory=dict)
    followups: list[TeamMessage] = field(default_factory=list)
    opened: set[str] = field(default_factory=set)
    claim_lost: ClaimError | None = None

    @property
    def mailbox_id(self) -> str:
        """The caller's own mailbox id."""
        return mailbox_id(self.team_name, self.self_name)

    @property
    def current_replied(self) -> TeamMessage | None:
        """The reply that closed ``current``, or ``None``."""
        if self.current is None:
            return None
        return self.replies.get(self.current.id)

    def resolve_recipient(self, to: str) -> str:
        """A member name, ``"lead"``, or a full ``"<team>::<name>"`` id -> mailbox id.
        Raises :class:`TeamToolError` listing the valid names otherwise."""
        name = to
        prefix = f"{self.team_name}::"
        if to.startswith(prefix):
            name = to[len(prefix) :]
        if name == LEAD or name in self.member_names:
            return mailbox_id(self.team_name, name)
        valid = ", ".join([LEAD, *self.member_names])
        raise TeamToolError(
            f'team_send: unknown recipient "{to}" in team "{self.team_name}"; valid recipients: {valid}. '
            "Nothing was sent."
        )

    async def _target(self, message_id: str | None, tool_name: str) -> tuple[TeamMessage, str | None]:
        """The message a reply/follow-up addresses, and the token to close it with."""
        if message_id is None or (self.current is not None and message_id == self.current.id):
            if self.current is None:
                raise TeamToolError(
                    f"{tool_name}: message_id is required (this run was not started for a message)"
                )
            if self.claim_lost is not None:
                raise TeamToolError(
                    f"{tool_name}: the claim on message {self.current.id} was lost: {self.claim_lost}"
                )
            if self.current.id in self.replies:
                raise TeamToolError(f"{tool_name}: message {self.current.id} is already closed by team_reply")
            return self.current, self.token
        message = await self._own_message(message_id, tool_name, "you can only answer messages you claimed")
        if message.status != MessageStatus.READ:
            raise TeamToolError(
                f"{tool_name}: message {message_id} is {message.status.value}; you can only answer the message "
                "this run was started for or one you opened with team_read. Nothing changed."
            )
        return message, None

    async def _own_message(self, message_id: str, tool_name: str, rule: str) -> TeamMessage:
        """The message ``message_id`` of the caller's own mailbox; otherwise a
        :class:`TeamToolError` (unknown id, or addressed elsewhere: ``rule`` says why)."""
        message = await self.mailbox.get(message_id)
        if message is None:
            raise TeamToolError(f"{tool_name}: no message with id {message_id!r}; nothing changed")
        if message.to != self.mailbox_id:
            raise TeamToolError(
                f'{tool_name}: message {message_id} is addressed to "{message.to}", not to your mailbox '
                f'"{self.mailbox_id}"; {rule}. Nothing changed.'
            )
        return message

    def _upstream(self, kind: str, status: str) -> dict[str, Any]:
        """The metadata of a reply / follow-up (``kind``) leaving its message ``status``."""
        return {"kind": kind, "member": self.self_name, "status": status, "team": self.team_name}

    async def _send_upstream(
        self, target: TeamMessage, content: str, metadata: dict[str, Any], checked: Outgoing | None = None
    ) -> TeamMessage:
        """Send ``content`` back to ``target``'s sender (same thread and work item, ``reply_to`` = target).
        ``checked``: what :meth:`_check_fits` made of these same arguments; a store
        whose ``send`` is :class:`CheckedSend`'s own then stores it without checking
        everything again."""
        if checked is not None and _plain_checked_send(self.mailbox):
            return await self.mailbox._append(checked)  # type: ignore[attr-defined, no-any-return]
        return await self.mailbox.send(
            self.mailbox_id,
            target.from_,
            content,
            thread_id=target.thread_id,
            work_item_id=target.work_item_id,
            reply_to=target.id,
            metadata=metadata,
        )

    def _check_fits(
        self, tool_name: str, target: TeamMessage, content: str, metadata: dict[str, Any]
    ) -> Outgoing | None:
        """Refuse an upstream message the store would reject for its size *before*
        anything changes (a reply must not close its message and then fail to send).
        Returns the checked request (for :meth:`_send_upstream`), or ``None`` when
        the store has no size bound."""
        limit = getattr(self.mailbox, "max_message_bytes", None)
        if not isinstance(limit, int) or isinstance(limit, bool):
            return None
        try:
            return check_send(  # the arguments _send_upstream will pass
                self.mailbox_id,
                target.from_,
                content,
                thread_id=target.thread_id,
                work_item_id=target.work_item_id,
                reply_to=target.id,
                metadata=metadata,
                max_message_bytes=limit,
            )
        except MessageTooLargeError as exc:
            raise UpstreamTooLargeError(
                f"{tool_name}: your message is too large for the team mailbox ({exc}). Nothing was sent and "
                f"message {target.id} is still open: send a shorter text (summarise, or write the full output "
                "to a file and give its path).",
                str(exc),
            ) from None

    async def send(self, to: str, content: str, *, dedup_key: str | None = None) -> TeamMessage:
        """``team_send``: a new message from the caller to ``to`` (same thread as ``current``).
        ``dedup_key`` (the tool call's ``effect_key``): a call run again -- after a
        crash, on another worker -- gets the message its first run sent, not a
        second one (for stores whose ``send`` takes ``dedup_key``: the built-in ones)."""
        target = self.resolve_recipient(to)
        extra = {"dedup_key": dedup_key} if dedup_key and _takes_dedup_key(self.mailbox) else {}
        message = await self.mailbox.send(
            self.mailbox_id,
            target,
            content,
            thread_id=self.current.thread_id if self.current is not None else None,
            metadata={"kind": "message", "from_member": self.self_name, "team": self.team_name},
            **extra,
        )
        await emit_event(
            self.emit, TeamMessageEvent(subtype="sent", team=self.team_name, message=message.to_json_dict())
        )
        return message

    async def reply(
        self, content: str, message_id: str | None, *, structured_result: Any = None
    ) -> TeamMessage:
        """``team_reply``: close the target message ``done`` (fenced first, so a
        run that lost its claim writes nothing), then send the reply upstream
        (``reply_to`` = the target, same thread and work item). A reply too large
        for the store is refused before the target is closed."""
        target, token = await self._target(message_id, "team_reply")
        metadata = self._upstream("reply", "done")
        if structured_result is not None:
            metadata["structured_result"] = structured_result
        checked = self._check_fits("team_reply", target, content, metadata)
        try:
            await set_message_status(self.mailbox, target.id, MessageStatus.DONE, token)
        except ClaimError as exc:
            if target is self.current:
                self.claim_lost = exc
            raise TeamToolError(f"team_reply: {exc}; nothing was sent") from None
        except (InvalidTransitionError, LookupError) as exc:
            raise TeamToolError(
                f"team_reply: cannot close message {target.id}: {exc}; nothing was sent"
            ) from None
        reply = await self._send_upstream(target, content, metadata, checked)
        self.replies[target.id] = reply
        done = target.to_json_dict()  # a fresh dict: the ended message without copying the model
        done["status"] = MessageStatus.DONE.value
        done["claim_token"] = None
        await emit_event(
            self.emit, TeamMessageEvent(subtype="reply", team=self.team_name, message=reply.to_json_dict())
        )
        await emit_event(self.emit, TeamMessageEvent(subtype="done", team=self.team_name, message=done))
        return reply

    async def followup(self, content: str, message_id: str | None) -> TeamMessage:
        """``team_followup``: send progress upstream; the target stays open."""
        target, _ = await self._target(message_id, "team_followup")
        metadata = self._upstream("followup", "open")
        checked = self._check_fits("team_followup", target, content, metadata)
        message = await self._send_upstream(target, content, metadata, checked)
        self.followups.append(message)
        await emit_event(
            self.emit,
            TeamMessageEvent(subtype="followup", team=self.team_name, message=message.to_json_dict()),
        )
        return message

    async def read(self, message_id: str) -> TeamMessage:
        """``team_read``: return a message of the caller's mailbox; a ``pending``
        one is claimed for this run by moving it to ``read`` (open, answerable
        with ``team_reply`` / ``team_followup``)."""
        message = await self._own_message(message_id, "team_read", "you can only read your own messages")
        if message.status == MessageStatus.PENDING:
            try:
                await self.mailbox.update_status(message_id, MessageStatus.READ)
            except InvalidTransitionError:
                message = await self.mailbox.get(message_id) or message  # someone claimed it first
            else:
                message = message.model_copy(update={"status": MessageStatus.READ})
                self.opened.add(message_id)
        return message

    async def status_counts(self) -> dict[str, dict[str, int]]:
        """``team_status``: per-status counts of every mailbox of the team."""
        out: dict[str, dict[str, int]] = {}
        counts_fn = getattr(self.mailbox, "counts", None)
        for name in [LEAD, *self.member_names]:
            box = mailbox_id(self.team_name, name)
            if callable(counts_fn):
                counts = dict(await counts_fn(box))
            else:
                counts = {s.value: 0 for s in MessageStatus}
                for message in await self.mailbox.inbox(box, "all"):
                    counts[message.status.value] += 1
            out[box] = {k: v for k, v in counts.items() if v}
        return out


def _plain_checked_send(mailbox: Any) -> bool:
    """True when ``mailbox.send`` is exactly :meth:`CheckedSend.send` (``check_send``
    with the store's ``max_message_bytes``, then ``_append``), not overridden or
    replaced on the instance."""
    return (
        isinstance(mailbox, CheckedSend)
        and type(mailbox).send is CheckedSend.send
        and "send" not in getattr(mailbox, "__dict__", {})
    )


def _takes_dedup_key(mailbox: Any) -> bool:
    """Whether ``mailbox.send`` accepts ``dedup_key`` (cached per class)."""
    cls = type(mailbox)
    known = _DEDUP_SENDS.get(cls)
    if known is None:
        try:
            known = "dedup_key" in inspect.signature(mailbox.send).parameters
        except (TypeError, ValueError):
            known = False
        _DEDUP_SENDS[cls] = known
    return known


_DEDUP_SENDS: dict[type, bool] = {}


__all__ = [
    "EmitFn",
    "MailboxToolState",
    "TeamToolError",
    "UpstreamTooLargeError",
    "emit_event",
    "set_message_status",
]
