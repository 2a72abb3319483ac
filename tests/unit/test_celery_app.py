"""The worker's Celery app module: what ``celery -A lattice_worker.runtime.worker.celery_app worker`` loads."""

from __future__ import annotations

import os
import subprocess
import sys

from lattice_client.celery_config import DELIVER_TASK, RESUME_LEAD_TASK, RUN_LEAD_TASK


def test_the_celery_app_module_registers_the_three_tasks_on_its_app():
    # in a fresh interpreter: the module builds its app from the environment at import
    code = (
        "import celery, lattice_worker.runtime.worker.celery_app as m\n"
        "from lattice_worker.runtime.worker import tasks\n"
        "assert isinstance(m.app, celery.Celery)\n"
        "names = sorted(n for n in m.app.tasks if n.startswith('lattice.'))\n"
        "print(','.join(names))\n"
        "t = m.app.tasks['lattice.run_lead']\n"
        "print(t.__wrapped__ is tasks.run_lead and t.max_retries == 5)\n"
        "other = celery.Celery('other')\n"
        "print(any(n.startswith('lattice.') for n in other.tasks))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    names, same, shared = out.stdout.split()
    assert names.split(",") == sorted([DELIVER_TASK, RESUME_LEAD_TASK, RUN_LEAD_TASK])
    assert same == "True"  # the body, with Celery's retry of Redis connection errors
    assert shared == "False"  # registered on this app only, not as shared tasks


def test_a_worker_warns_when_its_mailboxes_live_in_its_own_process():
    # memory:// and SQLite in memory are accepted (one process can use them) but no
    # client, lattice command or other worker sees such a worker's messages
    code = (
        "import logging, sys\n"
        "logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format='%(message)s')\n"
        "import lattice_worker.runtime.worker.celery_app as m\n"
        "local = ['memory://', 'sqlite://', 'sqlite:///', 'sqlite:///:memory:', 'sqlite:///f?mode=memory&cache=shared']\n"
        "shared = ['redis://:pw@h:6379/0', 'sqlite:///x.db', 'sqlite:////tmp/x.db', 'postgresql://u@h/db']\n"
        "print(all(map(m.process_local_mailbox, local)), any(map(m.process_local_mailbox, shared)))\n"
        "m._warn_process_local_mailbox()\n"
    )
    env = {
        **os.environ,
        "LATTICE_MAILBOX_URL": "memory://",
        "LATTICE_BROKER_URL": "redis://:secret@127.0.0.1:1/0",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=True
    )
    first, *rest = out.stdout.splitlines()
    assert first == "True False"
    assert rest == [
        "the mailbox URL memory:/// (LATTICE_MAILBOX_URL) keeps the mailboxes inside this worker process: "
        "no other worker or pool process, no client and no lattice command sees its messages; "
        "give redis://..., postgresql://... or a sqlite:///path file"
    ], out.stdout
