"""A real harness on the real engine, SIGKILLed mid-query or mid-agent (``lifecycle/reaper.py``).

Shared by ``test_harness_reaper_engine.py`` (asserts) and
``tests/bench/bench_reaper.py`` (prints the times). The harness is the
``bounded-query-harness run`` command line in a child process: the real
broker (runc), the agent in its container (``bounded-query-agent:latest``)
as an unprivileged uid. :func:`harness_run` waits for the moment to kill
(``query``: a query container of the run is running; ``agent``: the agent
container runs and has asked nothing), :func:`kill_and_measure` sends the
SIGKILL and polls, every :data:`POLL_S`, until no resource of the run is
left: no container or volume with its labels, no root, no mount under the
state base, no broker process.

Everything is bounded, and :func:`harness_run` removes on exit whatever
the run left (only this run's: by its run id), whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bounded_query.broker.protocol.policy import (
    LABEL_HARNESS_RUN,
    LABEL_INVOCATION,
    LABEL_OWNER,
    LABEL_ROLE,
    LABEL_RUN,
)
from bounded_query.harness.agent.spec import ROLE_AGENT
from tests.harness.bq_harness_helpers import make_repo, mounts_under, var_tmp_base, wait_gone

#: The agent's uid (the workspace's owner).
AGENT_UID = 20002
#: How long the run may take to reach the moment to kill.
START_LIMIT_S = 120.0
#: How long the run's resources may take to go after the SIGKILL.
REAP_LIMIT_S = 30.0
#: Resolution of the measurement.
POLL_S = 0.02
#: A query that outlives any test: only the SIGKILL ends it.
LONG_QUERY = "import time; time.sleep(280)"
AGENTS = {
    "query": (
        "sh",
        "-c",
        f"echo '{LONG_QUERY}' | bounded-query --repo octo/alpha"
        ' --schema \'{"type":"boolean"}\'; sleep 600',
    ),
    "agent": ("sleep", "600"),
}


@dataclass
class Running:
    """A harness reached its moment to be killed."""

    harness: subprocess.Popen[bytes]
    run_id: str
    base: Path
    stderr: Path
    reaper_pid: int
    broker_pids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Measured:
    """What :func:`kill_and_measure` saw."""

    #: SIGKILL to the moment nothing of the run was left (None: something stayed).
    seconds: float | None
    #: What was still there at the end (empty when clean).
    left: tuple[str, ...]
    #: The reaper's own ``reaper_reaped`` event (None if it emitted none).
    reaped: dict[str, Any] | None


def _events(path: Path) -> list[dict[str, Any]]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict) and "event" in doc:
                found.append(doc)
    return found


def _live(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _brokers(base: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                if b"bounded-query-broker" in cmdline and str(base).encode() in cmdline:
                    found.append(int(entry.name))
    return found


def leftovers(client: Any, run: Running) -> list[str]:
    """Every resource of the run that still exists (empty: all gone)."""
    left = []
    api = client.api  # plain listings: the high-level list inspects each, racing the removal
    for label in (LABEL_RUN, LABEL_HARNESS_RUN):
        for entry in api.containers(all=True, filters={"label": f"{label}={run.run_id}"}):
            left.append(f"container {entry['Names'][0]}")
    volumes = api.volumes(filters={"label": f"{LABEL_RUN}={run.run_id}"}) or {}
    left += [f"volume {v['Name']}" for v in volumes.get("Volumes") or ()]
    left += [f"root {p.name}" for p in run.base.iterdir()]
    left += [f"mount {p}" for p in mounts_under(run.base)]
    left += [f"broker {p}" for p in run.broker_pids if _live(p)]
    return left


def _config(tmp: Path) -> Path:
    config = tmp / "c.json"
    section = {
        "enabled": True,
        "runtime": "docker",
        "timeout": 300,
        "memoryLimit": "256m",
        "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}],
    }
    config.write_text(json.dumps({"boundedQueries": section}))
    return config


def _agent_run_id(client: Any, harness_pid: int) -> str | None:
    """The run id of the harness's running agent container, once there is one."""
    for entry in client.api.containers(filters={"label": f"{LABEL_ROLE}={ROLE_AGENT}"}):
        labels = entry.get("Labels") or {}
        with contextlib.suppress(ValueError, KeyError):
            if json.loads(labels[LABEL_OWNER]).get("pid") == harness_pid:
                return str(labels[LABEL_RUN])
    return None


def _wait_for_moment(client: Any, harness: subprocess.Popen[bytes], stderr: Path, mode: str) -> str:
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline:
        if harness.poll() is not None:
            raise AssertionError(f"the harness exited early: {stderr.read_text()[-3000:]}")
        run_id = _agent_run_id(client, harness.pid)
        if run_id is not None:
            if mode == "agent":
                return run_id
            queries = client.api.containers(
                filters={"label": [f"{LABEL_RUN}={run_id}", LABEL_INVOCATION], "status": "running"}
            )
            if queries:
                return run_id
        time.sleep(0.1)
    raise AssertionError(f"the run never reached the {mode} phase: {stderr.read_text()[-3000:]}")


@contextlib.contextmanager
def harness_run(client: Any, mode: str) -> Iterator[Running]:
    """A ``bounded-query-harness run`` process at its moment to be killed (``mode``)."""
    tmp = Path(tempfile.mkdtemp(prefix="bq-reaper-"))
    workspace = Path(tempfile.mkdtemp(prefix="bq-reaper-ws-", dir="/var/tmp"))
    os.chmod(workspace, 0o755)
    os.chown(workspace, AGENT_UID, AGENT_UID)
    source = tmp / "src"
    make_repo(source, {"README.md": "hi\n"})
    stderr = tmp / "stderr"
    harness: subprocess.Popen[bytes] | None = None
    run: Running | None = None
    try:
        with var_tmp_base() as base, open(stderr, "wb") as err:
            harness = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bounded_query.harness",
                    "run",
                    "--config",
                    str(_config(tmp)),
                    "--seed-source",
                    f"octo/alpha={source}",
                    "--workspace",
                    str(workspace),
                    "--state-base",
                    str(base),
                    "--",
                    *AGENTS[mode],
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
            try:
                run_id = _wait_for_moment(client, harness, stderr, mode)
                armed = [e for e in _events(stderr) if e["event"] == "reaper_armed"]
                assert armed, "the harness never armed its reaper"
                run = Running(harness, run_id, base, stderr, int(armed[0]["pid"]), _brokers(base))
                assert run.broker_pids, "no broker process found"
                yield run
            finally:
                _cleanup(client, harness, run)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(workspace, ignore_errors=True)


def _cleanup(client: Any, harness: subprocess.Popen[bytes], run: Running | None) -> None:
    """Kill what lives, give the reaper its chance, then remove this run's leftovers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(harness.pid, signal.SIGKILL)
    harness.wait()
    if run is None:
        return
    wait_gone(run.reaper_pid, REAP_LIMIT_S)
    for pid in [run.reaper_pid, *run.broker_pids]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    api = client.api
    for label in (LABEL_HARNESS_RUN, LABEL_RUN):
        for entry in api.containers(all=True, filters={"label": f"{label}={run.run_id}"}):
            with contextlib.suppress(Exception):
                api.remove_container(entry["Id"], force=True, v=True)
    volumes = api.volumes(filters={"label": f"{LABEL_RUN}={run.run_id}"}) or {}
    for volume in volumes.get("Volumes") or ():
        with contextlib.suppress(Exception):
            api.remove_volume(volume["Name"], force=True)
    from bounded_query.broker.mounts import unmount

    for point in sorted(mounts_under(run.base), reverse=True):
        with contextlib.suppress(OSError):
            unmount(Path(point))


def kill_and_measure(client: Any, run: Running) -> Measured:
    """SIGKILL the harness (itself only); poll until nothing of the run is left."""
    killed = time.monotonic()
    os.kill(run.harness.pid, signal.SIGKILL)
    deadline = killed + REAP_LIMIT_S
    seconds: float | None = None
    left: list[str] = []
    while time.monotonic() < deadline:
        left = leftovers(client, run)
        if not left:
            seconds = time.monotonic() - killed
            break
        time.sleep(POLL_S)
    wait_gone(run.reaper_pid, REAP_LIMIT_S)
    reaped = [e for e in _events(run.stderr) if e["event"] == "reaper_reaped"]
    return Measured(seconds, tuple(left), reaped[0] if reaped else None)
