"""The distributed runtime: the Celery app and its tasks, the lead and member
steps, leases, the reaper, the team registry and the worker entry points.

Nothing is re-exported here: import the module you need
(``lattice_worker.runtime.worker.celery_app`` is the Celery app, ``celery -A
lattice_worker.runtime.worker.celery_app worker``). See ``docs/contracts.md`` for
which module owns what.
"""
