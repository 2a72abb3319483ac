"""A Celery app for the Flower test: our configuration (from LATTICE_* variables) plus one no-op task."""

from __future__ import annotations

from lattice_client.celery_config import make_celery_app

app = make_celery_app()


@app.task(name="lattice.test_flower_noop")
def noop(tag: str) -> str:
    return tag
