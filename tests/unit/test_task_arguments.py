"""The Celery tasks refuse malformed arguments at once (a message anyone can put on a
queue): they return ``"invalid"`` and log what was wrong; nothing runs, nothing is read."""

from __future__ import annotations

import pytest

from lattice_worker.runtime.worker import tasks


@pytest.mark.parametrize("run_id", ["", "bad id", "a" * 129, "run\n1", 5, None, ["run_1"]])
def test_lead_tasks_refuse_a_malformed_run_id(run_id, caplog):
    with caplog.at_level("ERROR", logger="lattice_worker.runtime.worker.tasks"):
        assert tasks.run_lead(run_id) == "invalid"
        assert tasks.resume_lead(run_id) == "invalid"
    assert caplog.text.count("run_id must be a run id (1-128 characters of [A-Za-z0-9_.:-])") == 2


@pytest.mark.parametrize(
    ("args", "field"),
    [(("",), "mailbox_id"), ((7,), "mailbox_id"), (("t::m", ""), "message_id"), (("t::m", 3), "message_id")],
)
def test_deliver_refuses_a_malformed_mailbox_or_message_id(args, field, caplog):
    with caplog.at_level("ERROR", logger="lattice_worker.runtime.worker.tasks"):
        assert tasks.deliver(*args) == "invalid"
    assert f"{field} must be a non-empty string" in caplog.text
