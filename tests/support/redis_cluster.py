"""A throwaway Redis Cluster of the tests' own: 3 masters with one replica each.

``RedisClusterServers().start()`` starts six ``redis-server --cluster-enabled yes``
processes on free ports of 127.0.0.1 (each in its own directory under a
temporary directory, its own process group, ``--save '' --appendonly no``,
``cluster-node-timeout`` :data:`NODE_TIMEOUT_MS`), joins them with
``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`` and waits
until every node reports ``cluster_state:ok``. :meth:`RedisClusterServers.stop`
ends every process group by its id (never by name) and removes the directories.

:attr:`RedisClusterServers.url` is the product's cluster URL,
``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...``. Failover helpers:
:meth:`failover` (``CLUSTER FAILOVER`` on the replica of a master) and
:meth:`kill_master` / :meth:`restart_node` (kill -9 of a master's process
group, then the node comes back with its ``nodes.conf`` and rejoins as a
replica). :meth:`migrate_slot` moves one key's slot to another master as a
resharding does. :meth:`delete_prefix` deletes a test's keys on every master.

The session fixture ``redis_cluster`` (tests/conftest.py) starts one for the
whole session, only when a test asks for it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

import redis

from tests.support.redis_server import probe

NODE_TIMEOUT_MS = 1000
"""``cluster-node-timeout`` of the nodes (ms): how soon a dead master is failed over."""

NODES = 6
"""Nodes of the cluster: 3 masters, each with one replica."""


def _cluster_ports(count: int) -> list[int]:
    """``count`` free ports P of 127.0.0.1 whose cluster bus port P + 10000 is free too."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port in ports or port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


class RedisClusterServers:
    """Six ``redis-server`` process groups forming one cluster (see the module doc)."""

    def __init__(self) -> None:
        self.ports = _cluster_ports(NODES)
        self.root = tempfile.mkdtemp(prefix="lattice-cluster-")
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...`` (every node)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def admin(self, port: int) -> redis.Redis:
        """A plain (non-cluster) redis-py client of one node."""
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, decode_responses=True)

    def _start_node(self, port: int, timeout: float = 10.0) -> None:
        node_dir = os.path.join(self.root, str(port))
        os.makedirs(node_dir, exist_ok=True)
        args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", node_dir]
        args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        args += ["--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--save", "", "--appendonly", "no"]
        log = open(os.path.join(node_dir, "log"), "ab")  # noqa: SIM115 (the process keeps it)
        self.processes[port] = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=node_dir
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                with probe(port) as client:  # tries once (redis-py's retries waited seconds)
                    client.ping()
                return
            except redis.ConnectionError:
                if self.processes[port].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"cluster node {port} did not start:\n{self.log_tail(port)}") from None
                time.sleep(0.02)

    def log_tail(self, port: int) -> str:
        with open(os.path.join(self.root, str(port), "log"), "rb") as f:
            return f.read()[-1500:].decode(errors="replace")

    def start(self, timeout: float = 60.0) -> RedisClusterServers:
        """Start the six nodes, create the cluster and wait (up to ``timeout`` s) until it is ok."""
        try:
            for port in self.ports:
                self._start_node(port)
            create = ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports)]
            create += ["--cluster-replicas", "1", "--cluster-yes"]
            done = subprocess.run(create, capture_output=True, timeout=timeout, start_new_session=True)
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout[-2000:]!r}")
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every running node says ``cluster_state:ok``, sees 3 masters each
        owning slots, and every replica is in sync with its master."""
        deadline = time.monotonic() + timeout
        while True:
            problem = self._not_ok()
            if problem is None:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test cluster is not ok after {timeout} s: {problem}")
            time.sleep(0.1)

    def _not_ok(self) -> str | None:
        for port in self.running_ports():
            try:
                with self.admin(port) as client:
                    info = client.cluster("INFO")
                    if info.get("cluster_state") != "ok":
                        return f"node {port}: cluster_state {info.get('cluster_state')}"
                    role = client.info("replication")
                    if role["role"] == "slave" and role.get("master_link_status") != "up":
                        return f"replica {port}: master link {role.get('master_link_status')}"
            except redis.RedisError as exc:
                return f"node {port}: {exc}"
        masters = self.masters()
        if len(masters) != 3:
            return f"{len(masters)} masters with slots"
        return None

    def running_ports(self) -> list[int]:
        return [p for p, proc in self.processes.items() if proc.poll() is None]

    def _nodes(self) -> list[dict[str, Any]]:
        """``CLUSTER NODES`` of a running node, parsed: port, id, flags, master id, slots."""
        for port in self.running_ports():
            try:
                with self.admin(port) as client:
                    text = client.execute_command("CLUSTER", "NODES")
            except redis.RedisError:
                continue
            if isinstance(text, bytes):
                text = text.decode()
            nodes = []
            for line in str(text).splitlines():
                parts = line.split()
                address = parts[1].split("@")[0]
                nodes.append(
                    {
                        "id": parts[0],
                        "port": int(address.rsplit(":", 1)[1]) if ":" in address else 0,
                        "flags": set(parts[2].split(",")),
                        "master": parts[3],
                        "slots": parts[8:],
                    }
                )
            return nodes
        raise RuntimeError("no cluster node answers")

    def masters(self) -> list[int]:
        """Ports of the masters that own slots and are not failed."""
        return sorted(
            n["port"]
            for n in self._nodes()
            if "master" in n["flags"] and n["slots"] and "fail" not in n["flags"]
        )

    def master_of(self, key: str) -> int:
        """Port of the master that owns ``key``'s slot."""
        with self.admin(self.running_ports()[0]) as client:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
        for n in self._nodes():
            if "master" not in n["flags"] or "fail" in n["flags"]:
                continue
            for r in n["slots"]:
                low, _, high = r.partition("-")
                if not r.startswith("[") and int(low) <= slot <= int(high or low):
                    return int(n["port"])
        raise RuntimeError(f"no master owns the slot of {key!r}")

    def replica_of(self, master_port: int) -> int:
        """Port of a replica of the master on ``master_port``."""
        nodes = self._nodes()
        master_id = next(n["id"] for n in nodes if n["port"] == master_port)
        for n in nodes:
            if n["master"] == master_id and "fail" not in n["flags"] and n["port"] in self.running_ports():
                return int(n["port"])
        raise RuntimeError(f"master {master_port} has no running replica")

    def failover(self, master_port: int, timeout: float = 30.0) -> int:
        """``CLUSTER FAILOVER`` on a replica of ``master_port`` (a manual, coordinated
        failover); waits until that replica is a master and the cluster is ok.
        Returns the new master's port."""
        replica = self.replica_of(master_port)
        with self.admin(replica) as client:
            client.execute_command("CLUSTER", "FAILOVER")
        deadline = time.monotonic() + timeout
        while replica not in self.masters():
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {replica} did not take over from {master_port}")
            time.sleep(0.05)
        self.wait_ok(timeout)
        return replica

    def kill_master(self, master_port: int) -> None:
        """kill -9 of the process group of the master on ``master_port`` (no wait)."""
        process = self.processes[master_port]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def wait_promoted(self, dead_port: int, timeout: float = 30.0) -> None:
        """Wait until the slots of the killed master ``dead_port`` have a new master and
        the running nodes say ``cluster_state:ok``."""
        deadline = time.monotonic() + timeout
        while True:
            masters = self.masters()
            if dead_port not in masters and len(masters) == 3 and self._state_ok():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"no replica took over from the killed master {dead_port}")
            time.sleep(0.05)

    def _state_ok(self) -> bool:
        for port in self.running_ports():
            try:
                with self.admin(port) as client:
                    if client.cluster("INFO").get("cluster_state") != "ok":
                        return False
            except redis.RedisError:
                return False
        return True

    def restart_node(self, port: int, timeout: float = 30.0) -> None:
        """Start a stopped node again (its ``nodes.conf`` makes it rejoin, as a
        replica of whoever took its slots) and wait until the cluster is ok."""
        self._start_node(port)
        self.wait_ok(timeout)

    def migrate_slot(self, key: str, to_port: int, *, pause: float = 0.0) -> None:
        """Move the slot of ``key`` to the master on ``to_port`` the way a resharding does
        (``CLUSTER SETSLOT ... IMPORTING/MIGRATING``, ``MIGRATE`` one key at a time,
        ``pause`` seconds after each, then ``SETSLOT ... NODE`` on every master):
        meanwhile the slot's keys lie on both nodes, and clients get ``ASK`` (and
        ``TRYAGAIN`` for a command on several keys)."""
        source = self.master_of(key)
        if source == to_port:
            raise ValueError(f"{key!r} is on {to_port} already")
        ids = {n["port"]: n["id"] for n in self._nodes()}
        with self.admin(source) as src, self.admin(to_port) as dst:
            slot = int(src.execute_command("CLUSTER", "KEYSLOT", key))
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to_port])
            try:
                while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1):
                    src.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
                    time.sleep(pause)
            finally:  # the slot is the target's in the end, whatever happened
                for port in self.masters():
                    with self.admin(port) as client:
                        client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[to_port])
        self.wait_ok()

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with ``prefix`` on every master; returns how many."""
        deleted = 0
        for port in self.masters():
            with self.admin(port) as client:
                for key in client.scan_iter(match=f"{prefix}*", count=1000):
                    with contextlib.suppress(redis.ResponseError):  # MOVED: deleted on its owner
                        deleted += int(client.delete(key))
        return deleted

    def stop(self) -> None:
        """Stop every node's process group (SIGTERM, then SIGKILL after 5 s) and remove the directories."""
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        self.processes.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


__all__ = ["NODES", "NODE_TIMEOUT_MS", "RedisClusterServers"]
