"""The tests' RabbitMQ (127.0.0.1:5672, guest/guest): a private vhost per test.

``LATTICE_TEST_AMQP_URL`` is not read: the tests' RabbitMQ is the machine's
(``amqp://guest:guest@127.0.0.1:5672``). :func:`amqp_vhost` yields a broker URL
on a new vhost (``rabbitmqctl add_vhost``, deleted afterwards with every queue
and exchange in it); where ``rabbitmqctl`` cannot reach the node it yields the
default vhost ``/`` and the test keeps to its key prefix (every queue and
exchange name of a deployment carries it, lattice_client/celery_config.py); its
queues then stay behind (deleting them needs their names or the management API). :func:`require_rabbitmq` skips the test, with the
reason, only when nothing answers on 127.0.0.1:5672.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

AMQP_HOST = "127.0.0.1"
AMQP_PORT = 5672
AMQP_ROOT = f"amqp://guest:guest@{AMQP_HOST}:{AMQP_PORT}"
"""The tests' RabbitMQ without a vhost (append ``/<vhost>``; ``//`` is the default vhost)."""


def rabbitmq_answers(timeout: float = 1.0) -> bool:
    """Whether something accepts a TCP connection on 127.0.0.1:5672."""
    try:
        with socket.create_connection((AMQP_HOST, AMQP_PORT), timeout=timeout):
            return True
    except OSError:
        return False


def management_api_answers(timeout: float = 1.0) -> bool:
    """Whether RabbitMQ's management API (HTTP, 127.0.0.1:15672) accepts a connection:
    Flower reads queue lengths on RabbitMQ from it."""
    try:
        with socket.create_connection((AMQP_HOST, 15672), timeout=timeout):
            return True
    except OSError:
        return False


def require_rabbitmq() -> None:
    """Skip the calling test (``pytest.skip``) when nothing answers on 127.0.0.1:5672."""
    if not rabbitmq_answers():
        pytest.skip(f"RabbitMQ: nothing answers on {AMQP_HOST}:{AMQP_PORT} (the tests' broker for amqp://)")


def _ctl(*args: str) -> bool:
    tool = shutil.which("rabbitmqctl")
    if tool is None:
        return False
    try:
        done = subprocess.run([tool, "-q", *args], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@contextlib.contextmanager
def amqp_vhost(prefix: str) -> Iterator[str]:
    """Yield an ``amqp://`` broker URL of a vhost of its own (``<prefix>``,
    guest has every permission) and delete the vhost afterwards; or, when
    ``rabbitmqctl`` cannot create one, the default vhost's URL (``.../``).
    Skips the test when nothing answers on 127.0.0.1:5672."""
    require_rabbitmq()
    vhost = f"{prefix}-{uuid.uuid4().hex[:6]}"
    if _ctl("add_vhost", vhost) and _ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"):
        try:
            yield f"{AMQP_ROOT}/{vhost}"
        finally:
            _ctl("delete_vhost", vhost)
    else:
        yield f"{AMQP_ROOT}//"


def queue_types(url: str) -> dict[str, str]:
    """``{queue name: type}`` (``quorum``, ``classic``) of every queue on the
    vhost of ``url`` (``rabbitmqctl list_queues``). Raises ``AssertionError``
    when rabbitmqctl cannot list them."""
    vhost = url.rsplit("/", 1)[1] or "/"
    tool = shutil.which("rabbitmqctl")
    assert tool is not None, "rabbitmqctl is not installed"
    done = subprocess.run(
        [tool, "-q", "list_queues", "-p", vhost, "--no-table-headers", "name", "type"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return dict(line.split("\t", 1) for line in done.stdout.splitlines() if "\t" in line)


def _connection(url: str) -> Any:
    from kombu import Connection

    return Connection(url, connect_timeout=5)


def queue_length(url: str, queue: str) -> int:
    """Messages ready on ``queue`` (not those delivered and unacked, as Redis's
    list length); 0 when the queue does not exist."""
    with _connection(url) as conn:
        channel = conn.channel()
        try:
            return int(channel.queue_declare(queue=queue, passive=True).message_count)
        except conn.channel_errors:  # 404: no such queue
            return 0
        finally:
            with contextlib.suppress(Exception):
                channel.close()


def duplicate_message(url: str, queue: str) -> None:
    """Take the message at the head of ``queue`` and put it back twice, byte for
    byte (headers and properties too): the broker redelivering it. Raises
    ``AssertionError`` when the queue is empty."""
    from kombu import Producer

    with _connection(url) as conn:
        channel = conn.channel()
        message = channel.basic_get(queue=queue, no_ack=False)
        assert message is not None, f"no message on {queue}"
        properties = dict(message.properties)
        headers = properties.pop("application_headers", None) or {}
        content_type = properties.pop("content_type", None)
        content_encoding = properties.pop("content_encoding", None)
        kept = {k: v for k, v in properties.items() if k in ("correlation_id", "reply_to", "priority")}
        producer = Producer(channel)
        for _ in range(2):
            producer.publish(
                message.body,
                routing_key=queue,
                exchange="",
                headers=headers,
                content_type=content_type,
                content_encoding=content_encoding,
                **kept,
            )
        channel.basic_ack(message.delivery_tag)
        channel.close()


__all__ = [
    "AMQP_ROOT",
    "amqp_vhost",
    "management_api_answers",
    "duplicate_message",
    "queue_length",
    "queue_types",
    "rabbitmq_answers",
    "require_rabbitmq",
]
