"""The broker and host agents stay off the query CPUs (issue 9 part 5; sandbox/cpus.py)."""

from __future__ import annotations

import os

import pytest

from bounded_query.harness.lifecycle.broker_child import _spawn_broker
from bounded_query.sandbox.cpus import agent_cpu_set, agent_cpus, query_cpus


@pytest.mark.parametrize("host_cpus", [1, 2, 3, 4, 8, 64])
def test_the_agent_set_is_the_agent_list_and_disjoint_from_queries(host_cpus):
    agent = agent_cpu_set(host_cpus)
    first, _, last = query_cpus(host_cpus).partition("-")
    queries = set(range(int(first), int(last or first) + 1))
    assert agent
    assert max(agent) < host_cpus
    assert agent_cpus(host_cpus).startswith("0")
    if host_cpus > 1:
        assert agent.isdisjoint(queries)
        assert agent | queries == set(range(host_cpus))


def test_the_child_broker_runs_on_the_agent_cpus():
    process = _spawn_broker(["sleep", "30"], {"PATH": os.environ["PATH"]}, None)
    try:
        allowed = os.sched_getaffinity(process.pid)
    finally:
        process.kill()
        process.wait()
    assert allowed == agent_cpu_set(os.cpu_count() or 1)
