"""The worker process: the Celery app and its tasks, the asyncio pool, the
per-process state and event loops, the team registry, the registry heartbeat,
``lattice worker``'s entry point and ``lattice drain``."""
