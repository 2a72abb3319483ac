"""RunStore.status_and_parent: a run's status and parent link in one read (the member step's first read)."""

from __future__ import annotations

import pytest

from lattice_client.models import RunStatus
from lattice_client.runstore import RunStore
from tests.integration.conftest import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.timeout(30)]


async def test_status_and_parent_of_root_child_and_unknown_runs(prefix):
    store = RunStore(REDIS_URL, prefix)
    try:
        await store.create("root-1", "company", "hi")
        parent = {"run_id": "root-1", "message_id": "m_1", "mailbox_id": "company::eng"}
        await store.create("child.m_1", "eng", "task", parent=parent)
        assert await store.status_and_parent("root-1") == (RunStatus.QUEUED, None)
        status, link = await store.status_and_parent("child.m_1")
        assert status is RunStatus.QUEUED
        assert (link.run_id, link.message_id, link.mailbox_id) == ("root-1", "m_1", "company::eng")
        assert await store.status_and_parent("nosuch") == (None, None)
    finally:
        await store.aclose()
