"""The fail-closed check before a host agent starts (spec 14.8).

Theory of operation: ``--agent-on-host --agent-user UID[:GID]`` runs the
agent as that user on the host, which is only as safe as the host's
permissions. So, after the broker is ready and before the agent starts, a
probe process runs *as that user* (uid, gid, no supplementary groups --
exactly how the agent will run) and tries what an attacker would:

* traverse the private root (``stat`` of an entry below it);
* read ``/proc/<pid>/environ`` of the harness and of the broker;
* open or connect to the Docker socket; be in the socket's group;
* open the journal for writing;
* connect to the broker socket -- this one must *succeed*.

Every attempt that succeeds when it should fail (and a failed connect) is a
problem; so is a probe that cannot run or answers garbage (fail closed).
:func:`evaluate` turns the probe's JSON answer into problems and is pure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bounded_query.broker.protocol.policy import docker_socket_path

from .agent_spec import AgentUser
from .config import Problem

__all__ = ["PROBE_SOURCE", "HostCheck", "evaluate", "host_agent_problems"]

#: How long the probe may take.
PROBE_TIMEOUT_S = 30
#: Probe output kept (it is a short JSON object).
MAX_PROBE_OUTPUT = 65536

#: Runs as the agent's user; argv: private root, journal, socket, docker
#: socket, pid... Prints one JSON object: check name -> "reached"/"denied"
#: (the connect check: "connected"/"failed").
PROBE_SOURCE = r"""
import json, os, socket, sys
private_root, journal, broker_socket, docker_socket = sys.argv[1:5]
pids = sys.argv[5:]
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "reached"
    except OSError:
        out[name] = "denied"
def read(path):
    with open(path, "rb") as handle:
        handle.read(1)
attempt("private_root_traverse", lambda: os.stat(os.path.join(private_root, "seeds")))
attempt("private_root_list", lambda: os.listdir(private_root))
for pid in pids:
    attempt("environ:" + pid, lambda: read("/proc/%s/environ" % pid))
attempt("journal_write", lambda: os.close(os.open(journal, os.O_WRONLY | os.O_APPEND)))
def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(5)
        s.connect(path)
    finally:
        s.close()
attempt("docker_socket_connect", lambda: connect(docker_socket))
attempt("docker_socket_open", lambda: os.close(os.open(docker_socket, os.O_RDWR)))
try:
    connect(broker_socket)
    out["broker_socket"] = "connected"
except OSError:
    out["broker_socket"] = "failed"
out["groups"] = sorted(set(os.getgroups()) | {os.getgid()})
out["uid"] = os.getuid()
print(json.dumps(out))
"""


@dataclass(frozen=True, slots=True)
class HostCheck:
    """What the host-agent check looks at."""

    user: AgentUser
    private_root: Path
    journal: Path
    socket_path: Path
    pids: tuple[int, ...]
    docker_host: str


_FIX = "run the agent in its container (drop --agent-on-host), or pick another --agent-user"


def evaluate(
    check: HostCheck, answer: Mapping[str, object], docker_gid: int | None
) -> list[Problem]:
    """The problems in the probe's ``answer`` (empty: the user is confined enough)."""
    where = f"--agent-user {check.user}"
    problems: list[Problem] = []
    expected = [
        "private_root_traverse",
        "private_root_list",
        "journal_write",
        "docker_socket_connect",
        "docker_socket_open",
    ]
    expected += [f"environ:{pid}" for pid in check.pids]
    what = {
        "private_root_traverse": "can traverse the private root",
        "private_root_list": "can list the private root",
        "journal_write": "can open the journal for writing",
        "docker_socket_connect": "can connect to the Docker socket",
        "docker_socket_open": "can open the Docker socket",
    }
    for name in expected:
        value = answer.get(name)
        if value == "denied":
            continue
        if value == "reached":
            if name.startswith("environ:"):
                message = f"can read /proc/{name[8:]}/environ (the harness's or broker's)"
            else:
                message = what[name]
            problems.append(Problem(where, message, _FIX))
        else:
            problems.append(Problem(where, f"the probe did not answer {name!r}", _FIX))
    if answer.get("uid") != check.user.uid:
        problems.append(Problem(where, "the probe did not run as that uid", _FIX))
    groups = answer.get("groups")
    if not isinstance(groups, list):
        problems.append(Problem(where, "the probe did not report its groups", _FIX))
    elif docker_gid is not None and docker_gid in groups:
        problems.append(Problem(where, f"is in the Docker socket's group {docker_gid}", _FIX))
    if answer.get("broker_socket") != "connected":
        problems.append(
            Problem(
                where,
                "cannot connect to the broker socket",
                "give the agent a gid of its own (UID:GID); the socket is made that group's",
            )
        )
    return problems


def _probe_python() -> str:
    # The harness's interpreter may live where the agent user cannot go
    # (a virtualenv under /root): prefer the system one.
    for candidate in ("/usr/bin/python3", sys.executable):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return sys.executable


def host_agent_problems(check: HostCheck) -> list[Problem]:
    """Run the probe as ``check.user``; every reason the host agent is refused.

    Never raises: a probe that cannot run is itself the problem (fail closed).
    """
    where = f"--agent-user {check.user}"
    docker_socket = docker_socket_path(check.docker_host)
    docker_gid: int | None = None
    if docker_socket:
        try:
            docker_gid = os.stat(docker_socket).st_gid
        except OSError:
            docker_gid = None
    argv = [
        _probe_python(),
        "-I",
        "-S",
        "-c",
        PROBE_SOURCE,
        str(check.private_root),
        str(check.journal),
        str(check.socket_path),
        docker_socket or "/nonexistent",
        *(str(p) for p in check.pids),
    ]
    try:
        done = subprocess.run(
            argv,
            user=check.user.uid,
            group=check.user.gid,
            extra_groups=[],
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return [Problem(where, f"cannot run the confinement probe as that user: {exc}", _FIX)]
    try:
        answer = json.loads(done.stdout[:MAX_PROBE_OUTPUT])
    except ValueError:
        answer = None
    if done.returncode != 0 or not isinstance(answer, dict):
        detail = done.stderr.decode("utf-8", "replace")[-300:].strip()
        return [Problem(where, f"the confinement probe failed: {detail or done.returncode}", _FIX)]
    return evaluate(check, answer, docker_gid)
