"""The operations page (``lattice_client.ui``) read the way a browser gets it,
for tests that check what it shows: Starlette's test client over the real app,
no credentials set up (the page is then open)."""

from __future__ import annotations

from starlette.testclient import TestClient

from lattice_client import AsyncLatticeClient
from lattice_client.ui import Auth, create_app
from tests.support.services import REDIS_URL


def ui_html(prefix: str, path: str, broker_url: str = REDIS_URL) -> str:
    """The HTML of the page at ``path`` (``"/workers"``, ``"/calls"``...) for the
    deployment under key prefix ``prefix``; fails unless it answers ``200``.
    Blocking: from async tests call it through ``asyncio.to_thread``."""
    app = create_app(lambda: AsyncLatticeClient(broker_url=broker_url, key_prefix=prefix), Auth())
    with TestClient(app, base_url="http://testserver") as page:
        response = page.get(path)
    assert response.status_code == 200, response.text[:500]
    return response.text
