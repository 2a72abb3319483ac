"""Suite-wide fixtures.

Every test runs with ``HOME`` pointing at a fresh temporary directory, so agents
created with their default workspace (``~/.agent/workspaces/...``) never touch
the real home directory -- worker processes started by a test inherit it too.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
