"""Prepared query containers against a real engine, from the query's side (issue 20).

A prepared container is started before its request exists. These tests run
real scripts in real containers on runc and runsc and check what a hostile
script could exploit: that nothing runs in it before the request, that
nothing of an earlier invocation (files on any writable mount, processes)
is in the next one, that the container is gone after its one invocation,
and what it can learn about when it was prepared (the channel the README
lists: the moment of the preparation, nothing else).
"""

from __future__ import annotations

import json
import time

import pytest
import trio

from bounded_query.sandbox import DockerRunner
from bounded_query.sandbox.prepared import SlotState
from tests.sandbox.helpers import (
    RUNTIMES,
    leftover_containers,
    leftover_volumes,
    new_invocation,
    settings,
)

pytestmark = pytest.mark.engine

#: Leaves marks on every writable mount and a detached process behind.
LITTER = r"""
import os, subprocess
for d in ("/tmp", "/dev/shm", "/query", "/query/repo", "/awf"):
    with open(f"{d}/litter", "w") as fh:
        fh.write("from an earlier invocation")
subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL)
open("/query/out", "w").write("true")
"""

#: Reports what an earlier invocation could have left, and its own processes.
INSPECT = r"""
import json, os
found = [d for d in ("/tmp", "/dev/shm", "/query", "/query/repo", "/awf")
         if os.path.exists(f"{d}/litter")]
procs = sorted(open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")[0].decode()
               for p in os.listdir("/proc") if p.isdigit())
stdin = open("/proc/1/fd/0", "rb").read() if os.path.exists("/proc/1/fd/0") else None
open("/query/out", "w").write(json.dumps({
    "found": found, "procs": procs, "stdin_left": None if stdin is None else len(stdin),
    "awf": sorted(os.listdir("/awf")), "argv0": __import__("sys").argv[0],
}))
"""

#: How long ago the container was prepared, as a script can tell (runc: the
#: launcher's start in clock ticks since boot against the boot clock).
AGE = r"""
import os, time
stat = open("/proc/1/stat").read().rsplit(")", 1)[1].split()
started = int(stat[19]) / os.sysconf("SC_CLK_TCK")
open("/query/out", "w").write(repr(time.clock_gettime(time.CLOCK_BOOTTIME) - started))
"""


@pytest.fixture(params=RUNTIMES)
def runtime(request):
    return request.param


async def _with_runner(engine, runtime, body):
    cfg = settings(runtime)
    runner = DockerRunner(cfg)
    try:
        return await body(cfg, runner)
    finally:
        with trio.CancelScope(shield=True):
            await runner.reconcile()
            await runner.aclose()
        assert leftover_containers(engine, cfg.run_id, pin=True) == []
        assert leftover_volumes(engine, cfg.run_id) == []


async def test_nothing_runs_in_a_prepared_container_before_its_request(
    engine, work_root, seed, runtime
):
    async def body(cfg, runner):
        await runner.warm([seed])
        await runner.prepare(seed, work_root)
        assert runner.prepared.state(seed) is SlotState.READY
        (name,) = leftover_containers(engine, cfg.run_id)
        container = engine.containers.get(name)
        assert container.status == "running"
        if runtime == "docker":  # runsc's ps does not map the sandbox's processes
            # only the launcher, blocked on stdin
            commands = [p[-1] for p in container.top()["Processes"]]
            assert len(commands) == 1, commands
            assert commands[0].startswith("/usr/bin/python3 -I -S -c"), commands
        invocation = new_invocation(cfg, work_root, seed, INSPECT)
        report = await runner.run(invocation)
        assert report.failure is None, report
        assert "cold" not in report.phases  # it really ran in the prepared one
        facts = json.loads(report.result or b"{}")
        assert facts["argv0"] == "/awf/query-script.py"
        assert facts["awf"] == ["query-script.py"]
        assert leftover_containers(engine, cfg.run_id) == []
        return facts

    facts = await _with_runner(engine, runtime, body)
    assert facts["found"] == []
    # at its request: the launcher and the script, nothing started before
    assert sorted(facts["procs"]) == ["/usr/bin/python3", "python3"]


async def test_nothing_of_an_invocation_reaches_the_next(engine, work_root, seed, runtime):
    async def body(cfg, runner):
        await runner.warm([seed])
        await runner.prepare(seed, work_root)
        first = new_invocation(cfg, work_root, seed, LITTER)
        report = await runner.run(first)
        assert report.failure is None
        assert report.result == b"true"
        assert leftover_containers(engine, cfg.run_id) == []  # the sleeper died with it
        await runner.prepare(seed, work_root)  # as the broker's idle hook does
        second = new_invocation(cfg, work_root, seed, INSPECT)
        report = await runner.run(second)
        assert report.failure is None, report
        assert "cold" not in report.phases
        return json.loads(report.result or b"{}")

    facts = await _with_runner(engine, runtime, body)
    assert facts["found"] == []
    assert sorted(facts["procs"]) == ["/usr/bin/python3", "python3"]  # no sleeper


async def test_the_cold_path_runs_in_a_container_prepared_on_demand(
    engine, work_root, seed, runtime
):
    async def body(cfg, runner):
        invocation = new_invocation(cfg, work_root, seed, INSPECT)
        report = await runner.run(invocation)  # no idle hook: nothing was prepared
        assert report.failure is None, report
        assert {"cold", "create", "start", "deliver", "wait", "remove"} <= set(report.phases)
        assert leftover_containers(engine, cfg.run_id) == []
        assert runner.prepared.state(seed) is SlotState.EMPTY
        return json.loads(report.result or b"{}")

    facts = await _with_runner(engine, runtime, body)
    # the same layout as a prepared container: no bit says whether one waited
    assert facts["argv0"] == "/awf/query-script.py"
    assert facts["awf"] == ["query-script.py"]
    assert facts["found"] == []


async def test_a_script_can_tell_when_its_container_was_prepared(engine, work_root, seed):
    """The documented residual: the age is the time since preparation, nothing else."""

    async def body(cfg, runner):
        ages = []
        for wait_s in (0.0, 1.5):
            await runner.prepare(seed, work_root)
            prepared_at = time.monotonic()
            await trio.sleep(wait_s)
            invocation = new_invocation(cfg, work_root, seed, AGE)
            report = await runner.run(invocation)
            assert report.failure is None
            elapsed = time.monotonic() - prepared_at
            ages.append((float(report.result or b"nan"), wait_s, elapsed))
        return ages

    ages = await _with_runner(engine, "docker", body)
    for age, wait_s, elapsed in ages:
        # clock ticks are 10 ms; the age spans the wait (and the run itself)
        assert wait_s - 0.02 <= age <= elapsed + 0.5, (age, wait_s, elapsed)
