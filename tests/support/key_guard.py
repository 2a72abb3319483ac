"""The suite's guard against writes outside a test's own prefix and DB.

Tests keep their Redis keys under ``test-<...>`` prefixes in the DB of
``LATTICE_TEST_REDIS_URL`` (:mod:`tests.support.services`). When that DB is not
0, ``tests/conftest.py`` checks each test with a :class:`KeyGuard`:

* a key that appears in **DB 0** during the test under a prefix the test used in
  the test DB fails the test (a client that fell back to the library's default
  ``redis://127.0.0.1:6379/0``). The keys are deleted.
* a key the test leaves in the **test DB** without a ``test-`` prefix fails it
  (each such key is reported once).

Keys that other processes write meanwhile (another suite on DB 0, other
prefixes) are not counted: DB 0 is judged only by the test's own prefixes. With
the test DB 0 (the default) nothing is checked, since DB 0 is the server's
shared one. Each check is a SCAN of both DBs (they hold few keys).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis

TEST_KEY_PREFIX = "test-"
"""What every key a test leaves in the test DB starts with."""


def _prefix_of(key: str) -> str:
    return key.split(":", 1)[0]


class KeyGuard:
    """Snapshots of DB 0 and the test DB around one test at a time (see the module doc)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.test_db = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)
        self.db_zero = redis.Redis.from_url(
            urlunsplit(parts._replace(path="/0")), decode_responses=True, socket_timeout=10
        )
        self.known = self._keys(self.test_db)
        """Test-DB keys that were there before (or were already reported)."""
        self._zero_before: set[str] = set()
        self._prefixes: set[str] = set()

    @staticmethod
    def _keys(client: redis.Redis) -> set[str]:
        return set(client.scan_iter(count=1000))

    def before(self) -> None:
        """Called before a test's set-up: remember DB 0's keys."""
        self._zero_before = self._keys(self.db_zero)
        self._prefixes = set()

    def seen(self) -> None:
        """Called right after a test's body (its keys still exist): remember its prefixes."""
        self._prefixes |= {_prefix_of(k) for k in self._keys(self.test_db) if k.startswith(TEST_KEY_PREFIX)}

    def after(self) -> list[str]:
        """Called after a test's teardown: the problems found (empty when none)."""
        problems = []
        leaked = sorted(
            k for k in self._keys(self.db_zero) - self._zero_before if _prefix_of(k) in self._prefixes
        )
        if leaked:
            self.db_zero.delete(*leaked)
            problems.append(f"wrote {len(leaked)} key(s) to DB 0 instead of the test DB, e.g. {leaked[:5]}")
        foreign = sorted(
            k for k in self._keys(self.test_db) - self.known if not k.startswith(TEST_KEY_PREFIX)
        )
        if foreign:
            self.known.update(foreign)
            problems.append(
                f"left {len(foreign)} key(s) without a {TEST_KEY_PREFIX!r} prefix in the test DB: {foreign[:5]}"
            )
        return problems

    def close(self) -> None:
        self.test_db.close()
        self.db_zero.close()


__all__ = ["TEST_KEY_PREFIX", "KeyGuard"]
