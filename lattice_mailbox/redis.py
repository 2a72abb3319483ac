"""``RedisMailbox``: the distributed mailbox store on ``redis.asyncio`` + Lua.

``claim_next`` is atomic across processes and hosts; design docs/architecture.md
(hash tags, leases, fencing, one Lua script per operation, bounded bodies).

Key scheme
----------
A mailbox id is hashed: ``tag = sha256(mailbox_id)[:16 hex]``. Every key of
that mailbox carries the Redis Cluster hash tag ``{tag}``, so each script
touches one slot only::

    <prefix>:{tag}:name          string  the mailbox id that owns the tag
    <prefix>:{tag}:seq           counter send sequence (FIFO order)
    <prefix>:{tag}:body          hash    message id -> body JSON (id, from, to, content,
                                         created_at, thread_id, work_item_id,
                                         reply_to, metadata; never changes)
    <prefix>:{tag}:state         hash    message id -> state JSON {s: status, q: seq,
                                         a: attempts, w: claimed_by, l: lease_until ms,
                                         f: claim token, x: expired claims}
    <prefix>:{tag}:q:<status>    zset    one per status: message ids scored by seq
    <prefix>:{tag}:leases        zset    leased message ids scored by lease_until (ms)
    <prefix>:mailboxes           set     registry of mailbox ids (written by an
                                         idempotent SADD before the first send of
                                         a store object to that id, in the same
                                         round trip -- on a Redis Cluster in a
                                         command of its own, just before; read by
                                         ``mailbox_ids`` and ``requeue_expired``)

Message ids are ``"<tag>-<32 hex>"``, so ``get``/``update_status``/``complete``
find the keys from the id alone, in O(1). Message data lives in the per-tag
hashes (not one key per message) so that ``claim_next`` receives every key it
touches in ``KEYS[]``: no script builds a key. Mailbox ids never appear in a key,
so any printable id is safe. Two different ids sharing a tag (a 64-bit hash
collision) can never mix: the ``name`` key records the owner, ``send`` to the
second id fails with :class:`MailboxError`, and reads of it see an empty mailbox.

Scripts live in ``lattice_mailbox/lua/`` (header comments list KEYS, ARGV,
returns and codes). They are called by SHA (``EVALSHA``) and loaded with
``SCRIPT LOAD`` on ``NOSCRIPT``. Leases use the Redis server clock (``TIME``),
so workers on different hosts agree on expiry.

Connections
-----------
An asyncio client must not be shared between event loops. Built from a URL,
the store creates one client per running loop, lazily. A client passed in is
used as is (the caller owns it and its loop). Clients built here follow
:mod:`lattice_mailbox.connections`: a connection the server closed while idle is
found and replaced before a command goes on it, and no command is blindly resent
(a resend of ``claim_next`` would claim a second message). A call whose
connection is lost mid-call is decided by its own ids: ``send`` is sent again
with the same message id (the script refuses an id it holds, so one copy is
stored), ``claim_next`` finds the claim its token holds, ``complete`` /
``finish_claim`` and ``extend_lease`` are sent again (the same token again
replays a finish that happened; a second extension is harmless); the other
operations surface :class:`redis.exceptions.ConnectionError` and the caller decides.
Each script is atomic, so a failed call never leaves a half-written message.
Scripts are called with redis-py's own ``Redis.evalsha`` (connections held
between calls, below redis-py's command path, were measured at about 1% of the
handoff round trip of ``bench/distributed.py``: not worth it).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .base import ClaimMissingError, ClaimTakenError, MailboxError
from .connections import async_redis, read_again
from .message import MessageStatus, TeamMessage
from .redis_layout import SCRIPTS as _SCRIPTS
from .redis_layout import Keys as _Keys
from .redis_layout import body_json as _body
from .redis_layout import message_from as _message
from .redis_layout import messages_from as _messages
from .redis_layout import text as _text
from .transitions import STATUS_ORDER, invalid_transition, only_from_set, sources_for
from .urls import mask_url
from .validation import (
    DEFAULT_MAX_MESSAGE_BYTES,
    CheckedSend,
    Outgoing,
    check_claim,
    check_claim_id,
    check_complete,
    check_extend,
    check_inbox,
    check_max_message_bytes,
    check_name,
    check_prefix_filter,
    check_requeue,
    mailbox_tag,
    message_id_tag,
    new_token,
)

S = MessageStatus
_STATUS_NAMES = " ".join(s.value for s in STATUS_ORDER)
_REQUEUE_BATCH = 500
_PIPELINE_CHUNK = 200


def _check_prefix(prefix: Any) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
    if not prefix or any(ch in prefix for ch in "{} \t\r\n"):
        raise ValueError(f"key prefix must be non-empty without braces or whitespace, got {prefix!r}")
    return prefix


class RedisMailbox(CheckedSend):
    """Redis :class:`~lattice_mailbox.base.LeasedMailbox` (see the module docstring).

    ``url_or_client``: a ``redis://``/``rediss://``/``unix://`` URL or a Redis
    Cluster URL ``redis+cluster://h:p[,h:p...]`` (a client is made per event loop
    with :func:`lattice_mailbox.connections.async_redis`: dead idle connections
    replaced, no command resent) or a ready ``redis.asyncio.Redis`` /
    ``redis.asyncio.cluster.RedisCluster``. ``prefix`` starts every key (default ``lattice``).
    ``max_message_bytes`` bounds content + metadata JSON (bytes, default 1 MiB).
    Extra keyword arguments go to redis-py (``socket_timeout``, ``client_name``...).
    Network failures raise ``redis.exceptions.ConnectionError`` / ``TimeoutError``.
    """

    def __init__(
        self,
        url_or_client: str | aioredis.Redis,
        prefix: str = "lattice",
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        **client_kwargs: Any,
    ) -> None:
        self.prefix = _check_prefix(prefix)
        self.max_message_bytes = check_max_message_bytes(max_message_bytes)
        self._registry = f"{self.prefix}:mailboxes"
        self._client: aioredis.Redis | None = None
        self._url: str | None = None
        if isinstance(url_or_client, str):
            self._url = url_or_client
            self._client_kwargs = client_kwargs
        elif isinstance(url_or_client, (aioredis.Redis, AsyncRedisCluster)):
            self._client = url_or_client  # type: ignore[assignment]
        else:
            raise TypeError(
                "url_or_client must be a Redis URL or a redis.asyncio.Redis (or redis.asyncio.cluster.RedisCluster) client"
            )
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = (
            weakref.WeakKeyDictionary()
        )
        self._tag_keys: dict[str, _Keys] = {}
        self._box_keys: dict[str, tuple[_Keys, bytes]] = {}  # validated mailbox id -> keys, UTF-8 id
        # mailbox ids this object has added to the registry set (nothing removes a member
        # from it): their sends skip the SADD
        self._registered_ids: set[str] = set()

    def __repr__(self) -> str:
        where = mask_url(self._url) if self._url is not None else "a given client"
        return f"RedisMailbox({where!r}, prefix={self.prefix!r})"

    # -- connection + scripts -------------------------------------------------------

    def client(self) -> aioredis.Redis:
        """The client for the running event loop (created on first use)."""
        if self._client is not None:
            return self._client
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            assert self._url is not None
            client = async_redis(self._url, **self._client_kwargs)
            self._clients[loop] = client
        return client

    def _on_cluster(self) -> bool:
        return isinstance(self.client(), AsyncRedisCluster)

    def _keys(self, tag: str) -> _Keys:
        keys = self._tag_keys.get(tag)
        if keys is None:
            if len(self._tag_keys) > 50_000:
                self._tag_keys.clear()
            keys = self._tag_keys[tag] = _Keys.build(self.prefix, tag)
        return keys

    def _box(self, mailbox_id: str) -> tuple[_Keys, bytes]:
        """The keys and UTF-8 form of a mailbox id, validating the id the first
        time it is seen (``TypeError``/``ValueError`` from :func:`check_name`)."""
        found = self._box_keys.get(mailbox_id) if isinstance(mailbox_id, str) else None
        if found is None:
            check_name(mailbox_id)
            found = (self._keys(mailbox_tag(mailbox_id)), mailbox_id.encode("utf-8"))
            if len(self._box_keys) > 50_000:
                self._box_keys.clear()
            self._box_keys[mailbox_id] = found
        return found

    async def _evalsha(self, sha: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """``EVALSHA`` on the running loop's client (``Redis.evalsha``)."""
        return await self.client().evalsha(sha, len(keys), *keys, *args)

    async def _eval(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        script = _SCRIPTS[name]
        try:
            return await self._evalsha(script.sha, keys, args)
        except NoScriptError:
            await self.client().script_load(script.source)
            return await self._evalsha(script.sha, keys, args)

    async def _eval_many(
        self,
        name: str,
        calls: list[tuple[Sequence[Any], Sequence[Any]]],
        *,
        first: tuple[Any, ...] | None = None,
    ) -> list[Any]:
        """Run one script for many key sets in one pipelined round trip.
        ``first`` is an extra command ``(name, *args)`` sent ahead of them."""
        script = _SCRIPTS[name]
        client = self.client()
        results: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in range(2):
            pipe = client.pipeline(transaction=False)
            lead = first is not None and attempt == 0
            if lead:
                assert first is not None
                pipe.execute_command(*first)
            for i in todo:
                keys, args = calls[i]
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            raw = await pipe.execute(raise_on_error=False)
            if lead:
                if isinstance(raw[0], Exception):
                    raise raw[0]
                raw = raw[1:]
            retry = []
            for i, value in zip(todo, raw, strict=True):
                if isinstance(value, NoScriptError):
                    retry.append(i)
                elif isinstance(value, Exception):
                    raise value
                else:
                    results[i] = value
            if not retry:
                return results
            await client.script_load(script.source)
            todo = retry
        raise MailboxError(
            f"script {name} could not be loaded"
        )  # pragma: no cover - needs a racing SCRIPT FLUSH

    # -- the five protocol methods -------------------------------------------------

    # ``send`` (argument checks) comes from CheckedSend: one atomic script, so a
    # network failure (``redis.exceptions.ConnectionError``) leaves the message
    # fully written or absent. The message id is made here, before the call, and
    # send.lua refuses an id it holds already (DUPLICATE): a call whose reply was
    # lost is sent again with the same id, and DUPLICATE then means the lost call
    # wrote it -- one message either way, none lost.

    async def _append(self, out: Outgoing) -> TeamMessage:
        message = out.new_message()
        keys, owner = self._box(out.to)
        args = (owner, message.id, _body(message, out.metadata_json))
        calls = 0

        async def send_once() -> Any:
            nonlocal calls
            calls += 1
            return await self._send_script(out.to, keys, args)

        result = await read_again(send_once)
        code = _text(result[0])
        if code == "COLLISION":
            raise MailboxError(
                f"mailbox id {out.to!r} shares its hash tag with mailbox {_text(result[1])!r}; use another id"
            )
        if code == "DUPLICATE" and out.dedup_key is not None:
            stored = await self.get(message.id)  # sent before under this key: that message
            if stored is not None:
                return stored
        if code == "DUPLICATE" and calls > 1:
            return message  # the call whose reply was lost had written it
        if code != "OK":  # pragma: no cover - DUPLICATE needs a repeated random id
            raise MailboxError(f"send failed: {code}")
        return message

    async def _send_script(self, to: str, keys: _Keys, args: tuple[Any, ...]) -> Any:
        if to in self._registered_ids:
            # registered by an earlier send of this object: the send script alone
            try:
                result = await self._evalsha(_SCRIPTS["send"].sha, keys.send, args)
            except NoScriptError:
                result = await self._eval("send", keys.send, args)
        elif self._on_cluster():
            # the registry entry first (idempotent), so requeue_expired always finds the mailbox:
            # on a cluster in a command of its own (it lies in another slot), so that each of the
            # two is sent again while the cluster did not run it (a failover), as one command is
            await self.client().sadd(self._registry, to)
            result = await self._eval("send", keys.send, args)
            self._remember_registered(to)
        else:
            # the registry entry first (idempotent), so requeue_expired always finds the mailbox
            (result,) = await self._eval_many("send", [(keys.send, args)], first=("SADD", self._registry, to))
            self._remember_registered(to)
        return result

    def _remember_registered(self, mailbox_id: str) -> None:
        if len(self._registered_ids) > 50_000:
            self._registered_ids.clear()
        self._registered_ids.add(mailbox_id)

    async def inbox(
        self, mailbox_id: str, status: MessageStatus | str = "pending", *, limit: int | None = None
    ) -> list[TeamMessage]:
        """Messages of ``mailbox_id`` with ``status`` (or ``"all"``), oldest first,
        at most ``limit`` — a consistent snapshot read from the per-status index.
        Raises ``ValueError`` for an unknown status."""
        keys, owner = self._box(mailbox_id)
        wanted, limit = check_inbox(status, limit)
        queues = keys.all_queues if wanted is None else (keys.queues[wanted.value],)
        flat = await self._eval(
            "inbox", [keys.name, keys.body, keys.state, *queues], [owner, "" if limit is None else limit]
        )
        return _messages(flat)

    async def get(self, message_id: str) -> TeamMessage | None:
        """The message with this id, or ``None`` (also for a malformed id)."""
        tag = message_id_tag(message_id)
        if tag is None:
            return None
        keys = self._keys(tag)
        pipe = self.client().pipeline(transaction=True)
        pipe.hget(keys.body, message_id)
        pipe.hget(keys.state, message_id)
        body, state = await pipe.execute()
        if body is None or state is None:
            return None
        return _message(body, state)

    async def claim_next(
        self,
        mailbox_id: str,
        *,
        lease_s: float | None = None,
        worker_id: str | None = None,
        max_in_flight: int | None = None,
        message_id: str | None = None,
    ) -> TeamMessage | None:
        """Atomically move the oldest ``pending`` message of ``mailbox_id`` to
        ``processing`` and return it with a fresh ``claim_token``; ``None`` when
        nothing is pending or ``max_in_flight`` messages are in ``processing`` or ``parked``.
        When the call's reply is lost (the connection drops after Redis ran it), the
        message its claim token holds is returned; when the claim did not happen,
        ``redis.exceptions.ConnectionError`` / ``TimeoutError`` is raised.
        ``lease_s`` (seconds) sets ``lease_until`` (ms, server clock); without it the
        claim never expires. ``attempts`` counts claims. ``message_id``: claim
        that message instead (``None`` when it is not pending in ``mailbox_id``)."""
        keys, owner = self._box(mailbox_id)
        ms, worker_id, max_in_flight = check_claim(lease_s, worker_id, max_in_flight)
        token = new_token()
        args = (
            owner,
            b"" if ms is None else ms,
            worker_id or b"",
            token,
            b"" if max_in_flight is None else max_in_flight,
            check_claim_id(message_id),
        )
        try:  # the hot path: EVALSHA inline, one coroutine less (NOSCRIPT: load and retry)
            result = await self._evalsha(_SCRIPTS["claim_next"].sha, keys.claim, args)
        except NoScriptError:
            result = await self._eval("claim_next", keys.claim, args)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            result = await self._lost_claim(keys, token, exc)
        if not isinstance(result, list):
            return None  # 0: nothing pending, -1: at the in-flight limit
        message = TeamMessage.model_validate_json(result[0])
        message.status = S.PROCESSING
        message.attempts = int(result[1])
        message.claimed_by = worker_id
        message.lease_until = int(result[2]) or None
        message.claim_token = token
        return message

    async def _lost_claim(self, keys: _Keys, token: str, lost: Exception) -> Any:
        """The reply of a ``claim_next`` call was lost (its effect is unknown): the
        claim token decides. The message that token holds is the claim (returned as
        ``claim_next.lua`` would); when none holds it, the claim did not happen
        and ``lost`` is raised (the caller may claim again: nothing was claimed).
        A lookup that fails too raises ``lost``. After a *timeout* the lost call
        may still run later: its claim then waits for its lease to expire."""
        try:
            found = await self._eval(
                "find_claim", (keys.queues["processing"], keys.body, keys.state), (token,)
            )
        except (RedisConnectionError, RedisTimeoutError):
            raise lost from None
        if not isinstance(found, list):
            raise lost
        return found

    @property
    def url(self) -> str | None:
        """The Redis URL this store was built with (``None`` when it was given a client)."""
        return self._url

    def update_status_call(
        self, message_id: str, status: MessageStatus | str
    ) -> tuple[tuple[Any, ...], str] | None:
        """:meth:`update_status` (without ``only_from``) as ``(command, source)`` for a
        caller's own pipeline on this store's server: ``("evalsha", sha, numkeys, *keys,
        *args)`` and the script's Lua source; its reply is the script's (``UNKNOWN``,
        ``INVALID`` or ``OK`` first). ``None`` for an id of no mailbox of this store's
        form (:meth:`update_status` answers ``False`` for it)."""
        target = MessageStatus.parse(status)
        tag = message_id_tag(message_id)
        if tag is None:
            return None
        keys = self._keys(tag)
        sources = " ".join(sorted(s.value for s in sources_for(target, only_from_set(None))))
        all_keys = [keys.state, keys.leases, *keys.all_queues]
        script = _SCRIPTS["update_status"]
        args = [message_id, target.value, sources, _STATUS_NAMES]
        return ("evalsha", script.sha, len(all_keys), *all_keys, *args), script.source

    async def update_status(
        self, message_id: str, status: MessageStatus | str, *, only_from: Any = None
    ) -> bool:
        """Set a message's status per :mod:`lattice_mailbox.transitions` (one
        script); ``only_from`` (a status or several): only from those (a
        compare-and-set). ``False`` for an unknown id; ``ValueError`` for an
        unknown status; :class:`InvalidTransitionError` for a refused move
        (nothing changes)."""
        target = MessageStatus.parse(status)
        allowed_from = only_from_set(only_from)
        tag = message_id_tag(message_id)
        if tag is None:
            return False
        keys = self._keys(tag)
        sources = " ".join(sorted(s.value for s in sources_for(target, allowed_from)))
        result = await self._eval(
            "update_status",
            [keys.state, keys.leases, *keys.all_queues],
            [message_id, target.value, sources, _STATUS_NAMES],
        )
        code = _text(result[0])
        if code == "UNKNOWN":
            return False
        if code == "INVALID":
            raise invalid_transition(message_id, _text(result[1]), target, allowed_from)
        return True

    # -- lease capability --------------------------------------------------------

    async def extend_lease(self, message_id: str, token: str, lease_s: float) -> int:
        """Push the lease to server now + ``lease_s`` seconds; returns the new
        ``lease_until`` (ms). Raises :class:`ClaimTakenError` / :class:`ClaimMissingError`."""
        ms = check_extend(token, lease_s)
        tag = message_id_tag(message_id)
        if tag is None:
            raise ClaimMissingError(message_id)
        keys = self._keys(tag)
        # sent again when its reply is lost: a second extension from the server clock is harmless
        result = await read_again(
            lambda: self._eval("extend_lease", [keys.state, keys.leases], [message_id, token, ms])
        )
        code = _text(result[0])
        if code == "TAKEN":
            raise ClaimTakenError(message_id)
        if code == "MISSING":
            raise ClaimMissingError(message_id)
        return int(result[1])

    async def complete(self, message_id: str, token: str, status: MessageStatus | str) -> TeamMessage:
        """Fenced ``update_status`` from ``processing`` (one script): only the holder
        of ``token`` may finish the claim; repeating the same successful call
        returns the message again. Raises ``ValueError`` (unknown status),
        :class:`InvalidTransitionError` (target ``processing``),
        :class:`ClaimTakenError` or :class:`ClaimMissingError`."""
        result = await self._complete(message_id, token, status)
        return _message(result[1], result[2])

    async def finish_claim(self, message_id: str, token: str, status: MessageStatus | str) -> None:
        """:meth:`complete` for a caller that does not need the message back:
        the same script, checks and errors, without decoding the message."""
        await self._complete(message_id, token, status)

    async def _complete(self, message_id: str, token: str, status: MessageStatus | str) -> list[Any]:
        target, tag = check_complete(message_id, token, status)
        if tag is None:
            raise ClaimMissingError(message_id)
        keys = self._keys(tag)
        script_keys = (
            keys.state,
            keys.leases,
            keys.body,
            keys.queues["processing"],
            keys.queues[target.value],
        )
        # sent again when its reply is lost: the same token and status again is a REPLAY of the
        # finish that did happen (or the finish itself, when the lost call never ran)
        result = await read_again(
            lambda: self._eval("complete", script_keys, (message_id, target.value, token))
        )
        code = _text(result[0])
        if code == "TAKEN":
            raise ClaimTakenError(message_id)
        if code == "MISSING":
            raise ClaimMissingError(message_id)
        return result  # type: ignore[no-any-return]

    async def requeue_expired(
        self, *, max_attempts: int | None = None, now_ms: int | None = None
    ) -> list[TeamMessage]:
        """Move every ``processing`` message whose ``lease_until`` <= now (ms;
        default the server clock) back to ``pending``, or to ``failed`` when
        its claims have expired ``max_attempts`` times (see
        :meth:`LeasedMailbox.requeue_expired`). One script per mailbox of the registry,
        pipelined. Returns the moved messages with their new status."""
        max_attempts, now = check_requeue(max_attempts, now_ms)
        args = ["" if now is None else now, "" if max_attempts is None else max_attempts, _REQUEUE_BATCH]
        tags = sorted({mailbox_tag(m) for m in await self._registered()})
        moved: list[TeamMessage] = []
        while tags:
            chunk, tags = tags[:_PIPELINE_CHUNK], tags[_PIPELINE_CHUNK:]
            calls = []
            for tag in chunk:
                k = self._keys(tag)
                calls.append(
                    (
                        [
                            k.leases,
                            k.state,
                            k.body,
                            k.queues["processing"],
                            k.queues["pending"],
                            k.queues["failed"],
                        ],
                        args,
                    )
                )
            results = await self._eval_many("requeue_expired", calls)
            for tag, flat in zip(chunk, results, strict=True):
                moved.extend(_messages(flat))
                if len(flat) >= 3 * _REQUEUE_BATCH:
                    tags.append(tag)  # a full batch: there may be more
        return moved

    # -- extras --------------------------------------------------------------------

    async def counts(self, mailbox_id: str) -> dict[str, int]:
        """Number of messages per status value (all statuses, zeros included):
        one MULTI of ``ZCARD`` on the per-status indexes."""
        keys, _ = self._box(mailbox_id)
        pipe = self.client().pipeline(transaction=True)
        pipe.get(keys.name)
        for key in keys.all_queues:
            pipe.zcard(key)
        owner, *sizes = await pipe.execute()
        if owner is None or _text(owner) != mailbox_id:
            sizes = [0] * len(sizes)
        return {s.value: int(n) for s, n in zip(STATUS_ORDER, sizes, strict=True)}

    async def mailbox_ids(self, prefix: str | None = None) -> list[str]:
        """Every mailbox id a ``send`` was addressed to, sorted; only those
        starting with ``prefix`` when given."""
        check_prefix_filter(prefix)
        return sorted(m for m in await self._registered() if prefix is None or m.startswith(prefix))

    async def _registered(self) -> list[str]:
        return [_text(m) for m in await self.client().smembers(self._registry)]

    async def aclose(self) -> None:
        """Close the client this store created for the running loop and forget
        the others (a client passed in is left open: its owner closes it)."""
        if self._client is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - called outside a loop
            loop = None
        client = self._clients.pop(loop, None) if loop is not None else None
        self._clients.clear()
        if client is not None:
            await client.aclose()


__all__ = ["RedisMailbox"]
