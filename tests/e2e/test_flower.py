"""End-to-end (g): Flower started by ``lattice flower`` sees the running workers and their tasks.

Flower runs on a free loopback port with ``--unauthenticated`` (no credentials,
loopback only; its HTTP API open). It is started before the
worker so it receives the worker's task events from the first one.
"""

from __future__ import annotations

import ast

import httpx
import pytest

from tests.e2e.conftest import LATTICE, Deployment, free_port, wait_for
from tests.e2e.teams import plan
from tests.support import rabbitmq

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(150)]


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=5)
    except httpx.HTTPError:
        return None


def test_g_flower_lists_the_workers_and_deliver_tasks(deployment: Deployment):
    d = deployment
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    flower = d.start([LATTICE, "flower", "--unauthenticated", "--port", str(port)], "flower")
    wait_for(lambda: _get(f"{base}/healthcheck"), 45, "Flower to answer")
    # the lead and the members on separate workers, so doorbells travel through the broker
    leads = d.worker("tests.e2e.teams:team", "--member", "lead", "--concurrency", "1")
    members = d.worker(
        "tests.e2e.teams:team", "--member", "worker", "--member", "other", "--concurrency", "1"
    )
    lead_node = wait_for(lambda: _node_name(leads.log()), 10, "the lead worker's node name")
    node = wait_for(lambda: _node_name(members.log()), 10, "the member worker's node name")
    result = d.client.submit(
        "tests.e2e.teams:team", plan(("worker", "handoff", "seen"), ("other", "handoff", "too"))
    )
    assert result.wait(timeout=60).status == "completed"

    def workers() -> dict | None:
        response = _get(f"{base}/api/workers?refresh=1")
        if response is None or response.status_code != 200:
            return None
        data = response.json()
        return data if node in data and lead_node in data else None

    data = wait_for(workers, 30, f"Flower's /api/workers to list {lead_node} and {node}")
    assert {q["name"] for q in data[lead_node].get("active_queues", [])} == {f"{d.prefix}.e2e.lead"}
    assert {q["name"] for q in data[node].get("active_queues", [])} == {
        f"{d.prefix}.e2e.worker",
        f"{d.prefix}.e2e.other",
    }

    def deliver_tasks() -> list | None:
        response = _get(f"{base}/api/tasks")
        if response is None or response.status_code != 200:
            return None
        tasks = [t for t in response.json().values() if t.get("name") == "lattice.deliver"]
        return tasks if len(tasks) >= 2 and all(t.get("state") == "SUCCESS" for t in tasks) else None

    tasks = wait_for(deliver_tasks, 30, "Flower's /api/tasks to show the lattice.deliver tasks")
    # each doorbell names its mailbox and the message it delivers
    assert {ast.literal_eval(t["args"])[0] for t in tasks} == {"e2e::worker", "e2e::other"}
    assert all(len(ast.literal_eval(t["args"])) == 2 for t in tasks)
    assert {t["worker"] for t in tasks} == {node}
    # each names the member queue it came by (the routing key of its task-started event)
    assert {(ast.literal_eval(t["args"])[0], t.get("routing_key")) for t in tasks} == {
        ("e2e::worker", f"{d.prefix}.e2e.worker"),
        ("e2e::other", f"{d.prefix}.e2e.other"),
    }
    # the step that sent each doorbell is its parent, on the default (asyncio) pool too
    leads = {
        t["uuid"] for t in _get(f"{base}/api/tasks").json().values() if t.get("name") == "lattice.run_lead"
    }
    assert {t.get("parent_id") for t in tasks} <= leads and all(t.get("parent_id") for t in tasks)
    # Flower's broker page reads the queue lengths (it picks its Redis client by the broker URL's
    # scheme; on RabbitMQ it asks the management API, port 15672, and shows none without it)
    response = _get(f"{base}/api/queues/length")
    assert response is not None and response.status_code == 200, response and response.text
    names = {q["name"] for q in response.json()["active_queues"]}
    if d.amqp and not rabbitmq.management_api_answers():
        assert names == set() and "RabbitMQ management API call failed" in flower.log()
    else:
        assert f"{d.prefix}.e2e.lead" in names
    assert flower.alive()


def test_h_beside_an_all_queues_worker_two_member_workers_share_its_work_and_flower_shows_each_step(
    deployment: Deployment,
):
    d = deployment
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    flower = d.start([LATTICE, "flower", "--unauthenticated", "--port", str(port)], "flower")
    wait_for(lambda: _get(f"{base}/healthcheck"), 45, "Flower to answer")
    # the default layout: one worker consumes every queue; two more scale the member "worker"
    everything = d.worker("tests.e2e.teams:team", "--concurrency", "1")
    extra = [d.worker("tests.e2e.teams:team", "--member", "worker", "--concurrency", "1") for _ in range(2)]
    nodes = [
        wait_for(lambda p=p: _node_name(p.log()), 20, "a worker's node name") for p in [everything, *extra]
    ]
    # three work items of "worker" that each wait until three of them run at once:
    # the run completes only when each of the three processes takes one
    prompt = plan(*[("worker", "handoff", f"w{i} barrier=3") for i in range(3)])
    handle = d.client.submit("tests.e2e.teams:team", prompt)
    result = handle.wait(timeout=60)
    assert result.status == "completed", result
    assert (
        result.result
        == "final: done:worked[w0 barrier=3] | done:worked[w1 barrier=3] | done:worked[w2 barrier=3]"
    )
    pids = {entry.rsplit(":", 1)[1] for entry in d.redis.lrange(f"{d.prefix}:test:pids", 0, -1)}
    assert len(pids) == 3, pids

    def steps() -> dict | None:
        response = _get(f"{base}/api/tasks")
        if response is None or response.status_code != 200:
            return None
        tasks = [t for t in response.json().values() if t.get("state") == "SUCCESS"]
        delivers = [t for t in tasks if t.get("name") == "lattice.deliver" and t.get("result") == "'done'"]
        resumes = [t for t in tasks if t.get("name") == "lattice.resume_lead"]
        leads = [t for t in tasks if t.get("name") == "lattice.run_lead"]
        if len(delivers) >= 3 and resumes and leads:
            return {"deliver": delivers, "resume_lead": resumes, "run_lead": leads}
        return None

    found = wait_for(steps, 30, "Flower's /api/tasks to show each step of the run")
    # one lattice.deliver per handoff, each on its own worker, and the resume as a task of its own
    assert {ast.literal_eval(t["args"])[0] for t in found["deliver"]} == {"e2e::worker"}
    assert {t["worker"] for t in found["deliver"]} == set(nodes)
    assert [t["args"] for t in found["resume_lead"]] == [f"['{handle.run_id}']"]
    assert [t.get("routing_key") for t in found["resume_lead"]] == [f"{d.prefix}.e2e.lead"]
    assert [t["worker"] for t in found["resume_lead"]] == [
        nodes[0]
    ]  # only that worker consumes the lead queue
    assert [t["args"] for t in found["run_lead"]] == [f"['{handle.run_id}']"]
    assert flower.alive()


def _node_name(log: str) -> str | None:
    for line in log.splitlines():
        if line.strip().endswith(" ready.") and "lattice." in line:
            return line.split("INFO/MainProcess] ", 1)[-1].rsplit(" ready.", 1)[0].strip()
    return None
