"""The CPU partition between query containers and everything else.

Theory of operation: a query that modulates its CPU use can be timed *live*
by a process on the same core (the agent's own busy loop, or the latency of
the broker's refusals), around the timing bucket that hides only its total
duration. So query containers get CPUs (a cpuset) that the agent's
container or host user and the broker do not use: the last half of the host's
CPUs for queries, the first half for the agent and the broker. On the
2-core machines this project runs on: queries on CPU 1, agent and broker on
CPU 0. Queries are serialized, so one CPU is all a query ever gets anyway
(``spec.CPU_NANOS``).

What a partition cannot separate (shared last-level cache, memory bandwidth,
the disk, frequency scaling) stays a residual channel (README "Residual
channels"). A 1-CPU host cannot be partitioned: :func:`partitioned` is False
and both sides get CPU 0.

This is the one place the partition is defined; the runner (query side) and
the harness (agent and broker side) both call it with the host's CPU count.
Pure: no os import; callers pass the count.
"""

from __future__ import annotations

__all__ = ["agent_cpu_set", "agent_cpus", "cpu_list", "partitioned", "query_cpus"]


def _check(host_cpus: int) -> None:
    if not isinstance(host_cpus, int) or isinstance(host_cpus, bool) or host_cpus < 1:
        raise ValueError(f"host CPU count must be a positive integer, not {host_cpus!r}")


def cpu_list(first: int, last: int) -> str:
    """A cpuset list string for CPUs ``first``..``last`` inclusive (``"1"``, ``"2-3"``)."""
    return str(first) if first == last else f"{first}-{last}"


def partitioned(host_cpus: int) -> bool:
    """True when queries and the agent/broker get disjoint CPUs (``host_cpus >= 2``).

    Raises:
        ValueError: ``host_cpus`` is not a positive integer.
    """
    _check(host_cpus)
    return host_cpus >= 2


def query_cpus(host_cpus: int) -> str:
    """The ``CpusetCpus`` of every query container: the last half of the CPUs.

    Raises:
        ValueError: ``host_cpus`` is not a positive integer.
    """
    _check(host_cpus)
    if host_cpus == 1:
        return "0"
    return cpu_list(host_cpus - host_cpus // 2, host_cpus - 1)


def agent_cpus(host_cpus: int) -> str:
    """The CPUs of the agent (container cpuset or host affinity) and of the broker.

    Disjoint from :func:`query_cpus` whenever :func:`partitioned` is True.

    Raises:
        ValueError: ``host_cpus`` is not a positive integer.
    """
    _check(host_cpus)
    if host_cpus == 1:
        return "0"
    return cpu_list(0, host_cpus - host_cpus // 2 - 1)


def agent_cpu_set(host_cpus: int) -> set[int]:
    """:func:`agent_cpus` as a set of CPU numbers (for ``sched_setaffinity``).

    Raises:
        ValueError: ``host_cpus`` is not a positive integer.
    """
    first, _, last = agent_cpus(host_cpus).partition("-")
    return set(range(int(first), int(last or first) + 1))
