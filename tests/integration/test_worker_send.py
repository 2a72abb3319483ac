"""The steps a worker sends (``lattice_worker.runtime.worker.celery_app``) against the
real Redis: the task message lands on its queue without a task-sent event,
while the client's run_lead keeps its own. No worker runs; the worker's app is
built in a fresh interpreter (it reads its settings at import)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

from lattice_client import LatticeClient
from tests.support.registry import publish_fake_worker
from tests.support.services import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def _event(message: dict) -> dict:
    return json.loads(base64.b64decode(json.loads(message["data"])["body"]))


def test_a_worker_sent_step_has_no_task_sent_event_and_a_client_submit_has_one(prefix, raw):
    publish_fake_worker(prefix, {"example": "example"})
    pubsub = raw.pubsub()
    pubsub.psubscribe(f"{prefix}:*celeryev/task.sent")
    try:
        assert pubsub.get_message(timeout=5)["type"] == "psubscribe"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LATTICE_")}
        env.update({"LATTICE_BROKER_URL": REDIS_URL, "LATTICE_KEY_PREFIX": prefix})
        code = (
            "import lattice_worker.runtime.worker.celery_app as m\n"
            f"m._send_task('lattice.deliver', ['example::echo'], '{prefix}.example.echo')\n"
        )
        subprocess.run([sys.executable, "-c", code], env=env, timeout=60, check=True)
        (task,) = [json.loads(m) for m in raw.lrange(f"{prefix}:{prefix}.example.echo", 0, -1)]
        assert task["headers"]["task"] == "lattice.deliver"
        assert json.loads(base64.b64decode(task["body"]))[0] == ["example::echo"]
        # published after the worker's send: had that one published an event, it would come first
        with LatticeClient(REDIS_URL, key_prefix=prefix) as client:
            handle = client.submit("example", "hi")
        message = pubsub.get_message(timeout=5)
        assert message is not None and message["type"] == "pmessage"
        event = _event(message)
        assert event["type"] == "task-sent" and event["uuid"] == f"{handle.run_id}.run_lead"
    finally:
        pubsub.close()
