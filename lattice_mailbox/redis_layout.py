"""What :class:`~lattice_mailbox.redis.RedisMailbox` stores and runs: the keys of
one hash tag, the Lua scripts (``lattice_mailbox/lua/``, loaded once, called by
SHA1) and the stored forms of a message (body JSON, state JSON). The key scheme
is described in :mod:`lattice_mailbox.redis`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .message import MessageStatus, TeamMessage
from .transitions import STATUS_ORDER


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str


def load_script(name: str) -> Script:
    source = (resources.files("lattice_mailbox") / "lua" / f"{name}.lua").read_text(encoding="utf-8")
    return Script(name, source, hashlib.sha1(source.encode("utf-8")).hexdigest())


SCRIPTS = {
    name: load_script(name)
    for name in (
        "send",
        "claim_next",
        "update_status",
        "complete",
        "extend_lease",
        "requeue_expired",
        "inbox",
        "find_claim",
    )
}


@dataclass(frozen=True, slots=True)
class Keys:
    """Every key of one tag (see the module docstring), pre-encoded to bytes."""

    name: bytes
    seq: bytes
    body: bytes
    state: bytes
    leases: bytes
    queues: dict[str, bytes]  # status value -> zset key
    all_queues: tuple[bytes, ...]  # in STATUS_ORDER
    claim: tuple[bytes, ...]  # KEYS of claim_next.lua
    send: tuple[bytes, ...]  # KEYS of send.lua

    @classmethod
    def build(cls, prefix: str, tag: str) -> Keys:
        base = f"{prefix}:{{{tag}}}"
        queues = {s.value: f"{base}:q:{s.value}".encode() for s in STATUS_ORDER}
        name, body, state, leases = (f"{base}:{n}".encode() for n in ("name", "body", "state", "leases"))
        return cls(
            name=name,
            seq=f"{base}:seq".encode(),
            body=body,
            state=state,
            leases=leases,
            queues=queues,
            all_queues=tuple(queues[s.value] for s in STATUS_ORDER),
            claim=(name, queues["pending"], queues["processing"], leases, body, state, queues["parked"]),
            send=(name, f"{base}:seq".encode(), body, state, queues["pending"]),
        )


def text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def message_from(body: Any, state: Any) -> TeamMessage:
    # The body JSON is a TeamMessage in wire form (validated by pydantic-core in
    # one pass); the state JSON carries the mutable fields.
    message = TeamMessage.model_validate_json(body)
    st = json.loads(state)
    lease = st.get("l")
    message.status = MessageStatus(st["s"])
    message.attempts = int(st["a"])
    message.claimed_by = st.get("w")
    message.lease_until = None if lease is None else int(lease)
    return message


def body_json(message: TeamMessage, metadata_json: str | None = None) -> str:
    """The body JSON of a new message: its fields that never change.
    ``metadata_json``: the metadata's JSON when the caller has it already (the
    same text ``json.dumps`` gives, see :class:`~lattice_mailbox.validation.Outgoing`)."""
    fields = {
        "id": message.id,
        "from": message.from_,
        "to": message.to,
        "content": message.content,
        "created_at": message.created_at,
        "thread_id": message.thread_id,
        "work_item_id": message.work_item_id,
        "reply_to": message.reply_to,
    }
    if metadata_json is None:
        fields["metadata"] = message.metadata
        return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
    head = json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
    return f'{head[:-1]},"metadata":{metadata_json}}}'


def messages_from(flat: list[Any]) -> list[TeamMessage]:
    return [message_from(flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]
