"""Every Lua script touches the keys of one hash tag (one Redis Cluster slot).

A script on a Redis Cluster may only touch keys of one slot, all given in
``KEYS`` (the server refuses ``CROSSSLOT``; a key the script builds itself
would not be routed). Checked on the source of every script
(``lattice_mailbox/lua``, ``lattice_client/runstore/lua``,
``lattice_worker/runtime/*/lua``): its header's ``KEYS`` lines name one hash
tag (``{tag}``, ``{run:<id>}``, ``{<model>|<key id>}``), and every key argument
of a ``redis.call`` in its body is a ``KEYS[...]`` entry. The cluster suites
(tests/integration/test_mailbox_conformance.py, test_run_store*.py with
``STATE_STORES``, tests/e2e/test_workers_cluster.py) run them on a real cluster.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(
    [*ROOT.glob("lattice_mailbox/lua/*.lua"), *ROOT.glob("lattice_client/runstore/lua/*.lua")]
    + [*ROOT.glob("lattice_worker/runtime/*/lua/*.lua")]
)
KEYLESS = {"TIME", "ECHO", "PING"}
"""Commands whose first argument is no key."""

_CALL = re.compile(r"redis\.p?call\(\s*(['\"])(\w+)\1\s*(?:,\s*([^,)]+))?")
_TAG = re.compile(r":\{[^}]*\}")  # a key's hash tag: after a colon (not a JSON shape in a comment)
_FROM_KEYS = re.compile(r"(?:local\s+)?(\w+)(?:\[[^\]]*\])?\s*=\s*KEYS\[")


def test_there_are_scripts_to_check():
    assert len(SCRIPTS) >= 30


def problems(name: str, source: str) -> list[str]:
    """What keeps script ``source`` from running on one cluster slot (empty: nothing)."""
    found = []
    keys_lines = [line for line in source.splitlines() if re.match(r"--\s*KEYS\[", line)]
    if not keys_lines:
        found.append(f"{name}: no KEYS lines in its header")
    tags = {tag for line in keys_lines for tag in _TAG.findall(line)}
    if len(tags) > 1:
        found.append(f"{name}: its KEYS name several hash tags {sorted(tags)}")
    body = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("--"))
    from_keys = set(_FROM_KEYS.findall(body))  # locals holding KEYS entries (a status -> key table)
    for _, command, first in _CALL.findall(body):
        word = re.match(r"\w+", first.strip())
        if command.upper() in KEYLESS or (word and word.group(0) in from_keys):
            continue
        if not first.strip().startswith("KEYS["):
            found.append(f"{name}: redis.call('{command}', {first.strip()}) -- a key not from KEYS")
    return found


def test_the_check_finds_a_second_tag_and_a_built_key():
    bad = (
        "-- KEYS[1]  <p>:{a}:state\n-- KEYS[2]  <p>:{b}:leases\n"
        "redis.call('HGET', KEYS[1], 'x')\nredis.call('INCR', ARGV[1] .. ':n')\n"
    )
    assert problems("bad.lua", bad) == [
        "bad.lua: its KEYS name several hash tags [':{a}', ':{b}']",
        "bad.lua: redis.call('INCR', ARGV[1] .. ':n') -- a key not from KEYS",
    ]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_script_names_one_hash_tag_and_touches_only_its_keys(path: Path):
    assert problems(path.name, path.read_text(encoding="utf-8")) == []
