"""The worker's Celery app module: what ``celery -A lattice_worker.runtime.worker.celery_app worker`` loads."""

from __future__ import annotations

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
