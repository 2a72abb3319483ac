"""Suite-wide set-up: the tests run the same whatever the caller exported.

Every ``LATTICE_*`` variable except the documented test variables
(``LATTICE_TEST_REDIS_URL``, ``LATTICE_TEST_PG_URL``, see
:mod:`tests.support.services`), and the ``FLOWER_*``, ``ANTHROPIC_*`` and
``DEEPSEEK_*`` variables that would change what Flower or the model clients
do, are removed from this process's environment before any test module is
imported (module-level code of the runtime reads settings at import), and put
back when the session ends. Tests that need a setting pass it (keyword
arguments, ``monkeypatch.setenv``, a subprocess's own ``env``); one that a test
sets in ``os.environ`` directly (``lattice worker`` exports its global options
for the worker side) is removed again after that test.

Every test also runs with ``HOME`` pointing at a fresh temporary directory, so
agents created with their default workspace (``~/.agent/workspaces/...``) never
touch the real home directory -- worker processes started by a test inherit it too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.support.key_guard import KeyGuard
from tests.support.services import REDIS_DB, REDIS_URL, TEST_VARIABLES

_CLEARED_PREFIXES = ("LATTICE_", "FLOWER_", "ANTHROPIC_", "DEEPSEEK_")
_removed: dict[str, str] = {}


def caller_variables(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The variables of ``environ`` the suite must not see (see the module docstring)."""
    return {k: v for k, v in environ.items() if k.startswith(_CLEARED_PREFIXES) and k not in TEST_VARIABLES}


def pytest_configure(config: pytest.Config) -> None:
    for name, value in caller_variables(os.environ).items():
        _removed[name] = value
        del os.environ[name]


def pytest_unconfigure(config: pytest.Config) -> None:
    os.environ.update(_removed)
    _removed.clear()


@pytest.fixture(autouse=True, scope="session")
def _no_caller_variables() -> None:
    """Fails the session early if a caller variable is still in the environment."""
    leftover = caller_variables(os.environ)
    assert not leftover, f"tests/conftest.py left caller variables in the environment: {sorted(leftover)}"


@pytest.fixture(autouse=True)
def _no_leaked_variables():
    """Remove the caller variables a test left in ``os.environ`` (after monkeypatch restored its own)."""
    yield
    for name in caller_variables(os.environ):
        del os.environ[name]


@pytest.fixture(autouse=True)
def _private_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))


_guard: KeyGuard | None = None


@pytest.fixture(autouse=True, scope="session")
def _key_guard_session() -> Iterator[None]:
    """Starts the :class:`tests.support.key_guard.KeyGuard` when the test DB is not 0 (and Redis answers)."""
    global _guard
    if REDIS_DB != 0:
        try:
            _guard = KeyGuard(REDIS_URL)
        except redis.RedisError:  # no Redis: the tests that need one fail saying so
            _guard = None
    yield
    if _guard is not None:
        _guard.close()
        _guard = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    try:
        return (yield)
    finally:
        if _guard is not None:
            _guard.seen()


@pytest.fixture(autouse=True)
def _keys_in_own_prefix_and_db(_key_guard_session: None) -> Iterator[None]:
    """Fails a test that wrote to DB 0 or left keys outside ``test-*`` (see tests/support/key_guard.py)."""
    guard = _guard
    if guard is not None:
        guard.before()
    yield
    if guard is not None:
        problems = guard.after()
        assert not problems, "this test " + "; ".join(problems)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Any]:
    """A Redis Cluster of the session's own (3 masters, one replica each, on free
    ports; tests/support/redis_cluster.py), started on the first test that asks
    for it and stopped at the end of the session. Tests keep to their own key
    prefix and delete their keys (``redis_cluster.delete_prefix``). A test that
    fails a node over leaves the cluster ok (3 masters with one replica each)."""
    from tests.support.redis_cluster import RedisClusterServers

    with RedisClusterServers() as cluster:
        yield cluster
