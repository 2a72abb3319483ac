"""The Celery application configuration shared by the client, the workers and Flower.

Design: docs/architecture.md, "Steps as Celery tasks" (queues, JSON only, late acks, task events).
The client only *sends* tasks, by name
(``app.send_task("lattice.run_lead", args=[run_id], queue=queue_name(...))``);
the worker side (``lattice_worker.runtime.worker.celery_app``) builds its app with the same
function and registers the task bodies on it.

Isolation of deployments sharing one Redis (``key_prefix``):

* kombu's ``global_keyprefix`` transport option puts ``"<prefix>:"`` in front of
  every key the Redis transport touches: queue lists, the ``_kombu.binding.*``
  routing tables, the unacked hash/index/mutex, and the Pub/Sub channels used by
  fanout exchanges (remote control "pidbox" broadcasts and task events): kombu's
  ``PrefixedRedisPubSub`` prefixes ``SUBSCRIBE``/``PSUBSCRIBE`` and the prefixed
  client prefixes ``PUBLISH`` (checked in kombu 5.7's ``kombu/transport/redis.py``).
* One command of that transport is *not* prefixed: ``EXISTS`` (used only by
  passive queue declarations). As defence in depth every name kombu builds keys
  from carries the prefix too: our queues (``<prefix>.<team>.<member>``), the
  default queue (``<prefix>.default``), the control exchange (``<prefix>`` ->
  ``<prefix>.pidbox`` / ``reply.<prefix>.pidbox``) and the event exchange and
  event queues (``<prefix>.celeryev``). ``tests/integration/test_celery_config.py``
  checks with a real worker that every Redis key a round trip creates starts
  with ``"<prefix>:"`` and that another prefix sees no worker.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from lattice_mailbox.connections import CONNECT_TIMEOUT_SECONDS, keepalive_options

from .kombu_redis import ALIAS as KOMBU_TRANSPORT
from .settings import LatticeSettings, get_settings, is_amqp_url

HEALTH_CHECK_SECONDS = 10
"""kombu's ``health_check_interval`` (seconds): a broker connection idle longer is
``PING``-ed before use; also the period of kombu's checks of its BRPOP and
Pub/Sub connections (a half-open one is dropped after ``brpop_timeout`` + this)."""

BROKER_SOCKET_TIMEOUT_SECONDS = 10
"""kombu's ``socket_timeout`` (seconds) on broker connections: the longest a
publish, an ack or a task event waits for Redis's reply before it fails."""

AMQP_HEARTBEAT_SECONDS = 30
"""AMQP heartbeat (seconds) of RabbitMQ broker connections: a worker that stops
answering (frozen host, cut network) loses its connection after about two of
these, and RabbitMQ redelivers its unacked messages to another worker (a
kill -9 closes the socket, which redelivers at once)."""

LEAD_MEMBER = "lead"
"""Member name of a team's lead queue: ``queue_name(prefix, team, LEAD_MEMBER)``."""

RUN_LEAD_TASK = "lattice.run_lead"
"""Task name: run a lead turn of a new run (args: ``[run_id]``)."""

DELIVER_TASK = "lattice.deliver"
"""Task name: the doorbell of one mailbox (args: ``[mailbox_id]``)."""

RESUME_LEAD_TASK = "lattice.resume_lead"
"""Task name: resume a suspended lead run (args: ``[run_id]``)."""


def queue_name(prefix: str, team: str, member: str = LEAD_MEMBER) -> str:
    """The Celery queue of one team member: ``"<prefix>.<team>.<member>"``.

    ``member="lead"`` names the lead's queue (docs/deploy.md). Raises
    ``ValueError`` when a part is empty or contains whitespace.
    """
    for label, part in (("prefix", prefix), ("team", team), ("member", member)):
        if not part or any(ch.isspace() for ch in part):
            raise ValueError(f"queue_name: {label} must be non-empty without whitespace, got {part!r}")
    return f"{prefix}.{team}.{member}"


def _is_redis_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() == "redis"  # (rediss: kombu's own, for TLS)


def _redis_transport_options(prefix: str) -> dict[str, Any]:
    return {
        "global_keyprefix": f"{prefix}:",
        "fanout_prefix": True,
        "fanout_patterns": True,
        # kombu's redis-py connections (see docs/contracts.md, "Connections"): a
        # pooled connection closed by the server is replaced before a publish
        # (redis-py's blocking pool polls its socket); one idle longer than
        # this is PING-ed first; never a resent publish on a timeout
        # (a duplicate task); dead peers found by TCP keepalive
        "health_check_interval": HEALTH_CHECK_SECONDS,
        "retry_on_timeout": False,
        # a broker command that gets no reply fails after this (seconds) instead of
        # waiting forever: on the asyncio pool a step's publish blocks the loop every
        # step of the process shares (kombu's BRPOP waits 1 s, well inside it)
        "socket_timeout": BROKER_SOCKET_TIMEOUT_SECONDS,
        "socket_connect_timeout": CONNECT_TIMEOUT_SECONDS,
        "socket_keepalive": True,
        "socket_keepalive_options": keepalive_options(),
    }


def _broker_options(settings: LatticeSettings) -> dict[str, Any]:
    """The broker part of the configuration: Redis (our kombu transport, key
    prefix) or RabbitMQ (quorum queues, publisher confirms)."""
    if is_amqp_url(settings.broker_url):
        return {
            # quorum queues (replicated, durable): every task queue, declared or
            # created on first use; Celery then turns global QoS off (quorum queues
            # refuse it) and keeps prefetch per consumer. No priorities are used.
            "task_default_queue_type": "quorum",
            "task_create_missing_queue_type": "quorum",
            "worker_detect_quorum_queues": True,
            # topic exchanges (a queue's routing key is its own name, no wildcards in
            # it): Celery's native delayed delivery for quorum queues binds only those
            # (a direct exchange gets a warning per queue at every worker start)
            "task_default_exchange_type": "topic",
            "task_create_missing_queue_exchange_type": "topic",
            "broker_transport_options": {
                # a publish returns once RabbitMQ has the message (as Redis's LPUSH reply)
                "confirm_publish": True,
            },
            "broker_heartbeat": AMQP_HEARTBEAT_SECONDS,
            "broker_connection_timeout": CONNECT_TIMEOUT_SECONDS,
        }
    options: dict[str, Any] = {"broker_transport_options": _redis_transport_options(settings.key_prefix)}
    if _is_redis_url(settings.broker_url):
        # kombu's Redis transport with one redis-py client per channel (lattice_client/kombu_redis.py)
        options["broker_transport"] = KOMBU_TRANSPORT
    return options


def celery_config(settings: LatticeSettings) -> dict[str, Any]:
    """The Celery configuration (a dict for ``app.conf.update``) for ``settings``."""
    prefix = settings.key_prefix
    default_queue = f"{prefix}.default"
    return {
        "broker_url": settings.broker_url,
        "broker_connection_retry_on_startup": True,
        "broker_connection_retry": True,  # a lost broker connection is re-made, not fatal
        **_broker_options(settings),
        # JSON only: a pickled message is refused by the worker (ContentDisallowed).
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "result_accept_content": ["json"],
        "event_serializer": "json",
        # Runs keep their own results (run store + event stream): no result backend.
        "task_ignore_result": True,
        "result_backend": None,
        # A task is acked after it ran; a killed worker's task goes back to the queue.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # A broker blip (a lost consumer connection) lets running tasks finish: their
        # late ack is lost and the broker delivers the message again, which then finds
        # nothing to do (the mailbox claim or the lead lease is taken or done). True
        # would terminate them (prefork) and run them again after their lease.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # Task events for Flower.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        # Every queue/exchange name carries the prefix (see the module docstring).
        "task_default_queue": default_queue,
        "task_default_exchange": default_queue,
        "task_default_routing_key": default_queue,
        "task_create_missing_queues": True,
        "control_exchange": prefix,
        "event_exchange": f"{prefix}.celeryev",
        "event_queue_prefix": f"{prefix}.celeryev",
    }


def make_celery_app(settings: LatticeSettings | None = None, *, name: str = "lattice") -> Celery:
    """A new Celery app configured for ``settings`` (default: ``get_settings()``).

    The app is not set as the current app and has no tasks registered; the
    client uses it only to send tasks by name. Raises
    ``pydantic.ValidationError`` when the environment holds bad settings.
    """
    settings = settings if settings is not None else get_settings()
    app = Celery(name, set_as_current=False)
    app.conf.update(celery_config(settings))
    return app


__all__ = [
    "AMQP_HEARTBEAT_SECONDS",
    "BROKER_SOCKET_TIMEOUT_SECONDS",
    "DELIVER_TASK",
    "LEAD_MEMBER",
    "RESUME_LEAD_TASK",
    "RUN_LEAD_TASK",
    "celery_config",
    "make_celery_app",
    "queue_name",
]
