"""The CPU partition between queries and the agent/broker (sandbox/cpus.py, issue 9)."""

from __future__ import annotations

import pytest

from bounded_query.sandbox.cpus import agent_cpus, cpu_list, partitioned, query_cpus


def expand(text: str) -> set[int]:
    first, _, last = text.partition("-")
    return set(range(int(first), int(last or first) + 1))


def test_two_cores_one_each():
    assert query_cpus(2) == "1"
    assert agent_cpus(2) == "0"
    assert partitioned(2)


def test_one_core_cannot_be_partitioned():
    assert not partitioned(1)
    assert query_cpus(1) == agent_cpus(1) == "0"


@pytest.mark.parametrize("n", range(2, 65))
def test_disjoint_and_covering(n):
    queries, agent = expand(query_cpus(n)), expand(agent_cpus(n))
    assert not queries & agent
    assert queries | agent == set(range(n))
    assert queries
    assert agent


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2", None])
def test_bad_counts_are_refused(bad):
    for fn in (query_cpus, agent_cpus, partitioned):
        with pytest.raises(ValueError, match="positive integer"):
            fn(bad)


def test_cpu_list():
    assert cpu_list(3, 3) == "3"
    assert cpu_list(0, 5) == "0-5"
