"""The worker writer's RESP packing sends what redis-py would send."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from lattice_worker.runtime.worker_context import _pack

COMMANDS = [
    ("EVALSHA", "a" * 40, 2, "p:run:{run:r1}", "p:run:{run:r1}:events", 10000, '{"type":"x","t":"héllo ✓"}'),
    ("SET", "p:workitem:w1", '{"run_id":"r1"}', "EX", 604800),
    ("HINCRBY", "p:run:{run:r1}:usage", "input_tokens", -3),
    ("ZADD", "p:runs:leased", "GT", 1.5e12, "r1"),
    ("SCRIPT LOAD", "return 1"),
    (b"MGET", b"", b"x" * 70000, bytearray(b"ba"), memoryview(b"mv")),
    ("RPUSH", "k", "", 0, 3.25),
]


def test_pack_is_byte_identical_to_redis_py():
    conn = Connection()
    expected = b"".join(bytes(chunk) for chunk in conn.pack_commands(COMMANDS))
    assert _pack(conn.encoder.encode, COMMANDS) == [expected]
    assert _pack(conn.encoder.encode, COMMANDS, utf8=False) == [expected]


def test_pack_refuses_what_redis_py_refuses():
    conn = Connection()
    for bad in (True, None, object()):
        with pytest.raises(DataError):
            _pack(conn.encoder.encode, [("SET", "k", bad)])
