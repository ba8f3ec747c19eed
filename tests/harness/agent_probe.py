"""The attacker: an agent that tries to read what it may only ask about (issue 8).

Run as the agent command by ``test_harness_confinement.py`` (standard library
only: it runs in the agent image and on the host). argv: the workspace.

1. writes ``started`` into the workspace, then waits for ``targets.json``
   (written by the test once the broker is ready): the real paths of the
   private root, every seed (sealed included), the seed map, the broker
   config, the journal, the audit log, and the harness's and broker's pids;
2. tries everything an attacker would and records, per attempt, ``reached``
   (it worked: a confinement failure) or ``denied: <errno name>``;
3. collects every ``/proc/*/environ`` and ``/proc/*/cmdline`` it can read
   and its own environment, base64-encoded, so the test (which knows the
   token, the probe does not) can search them;
4. asks one real question through ``bounded-query``;
5. writes ``report.json`` into the workspace.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import json
import os
import socket
import subprocess
import sys
import time

WAIT_S = 120
PTRACE_ATTACH = 16
PTRACE_DETACH = 17
WALL = 0x40000000


def outcome(fn):
    try:
        fn()
    except OSError as exc:
        return "denied: " + errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "reached"


def read(path):
    with open(path, "rb") as handle:
        handle.read(1)


def write(path):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.close(fd)


def connect(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(5)
        sock.connect(path)
    finally:
        sock.close()


def ptrace_attach(pid):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) == 0:
        # Attached (a confinement failure): wait for the attach stop, then
        # detach and let it run on, so the run itself is not disturbed.
        os.waitpid(pid, WALL)
        libc.ptrace(PTRACE_DETACH, pid, None, 0)
        return
    code = ctypes.get_errno()
    raise OSError(code, os.strerror(code))


def proc_dump():
    """Every readable environ/cmdline (base64), keyed by ``pid/file``."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{name}/{part}", "rb") as handle:
                    data = handle.read()
            except OSError:
                continue
            found[f"{name}/{part}"] = base64.b64encode(data).decode()
    return found


def main():
    workspace = sys.argv[1]
    open(os.path.join(workspace, "started"), "w").close()
    targets_file = os.path.join(workspace, "targets.json")
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(targets_file):
        if time.monotonic() > deadline:
            sys.exit("no targets.json")
        time.sleep(0.05)
    time.sleep(0.1)
    with open(targets_file) as handle:
        targets = json.load(handle)
    attempts = {}
    root = targets["private_root"]
    attempts["list private root"] = outcome(lambda: os.listdir(root))
    attempts["traverse private root"] = outcome(lambda: os.stat(os.path.join(root, "seeds")))
    for seed in targets["seeds"]:
        attempts[f"list seed {seed}"] = outcome(lambda s=seed: os.listdir(s))
        attempts[f"read seed file {seed}"] = outcome(
            lambda s=seed: read(os.path.join(s, "README.md"))
        )
    for name in ("seed_map", "broker_config", "journal", "audit_log", "ready"):
        attempts[f"read {name}"] = outcome(lambda p=targets[name]: read(p))
    attempts["write journal"] = outcome(lambda: write(targets["journal"]))
    attempts["write audit log"] = outcome(lambda: write(targets["audit_log"]))
    attempts["connect docker socket"] = outcome(lambda: connect("/var/run/docker.sock"))
    attempts["open docker socket"] = outcome(
        lambda: os.close(os.open("/var/run/docker.sock", os.O_RDWR))
    )
    for who in ("harness", "broker"):
        pid = targets[f"{who}_pid"]
        attempts[f"read {who} environ"] = outcome(lambda p=pid: read(f"/proc/{p}/environ"))
        # Signal 0 runs the kernel's permission check of every signal but
        # SIGCONT (which any process of the same session may send: harmless).
        attempts[f"signal {who}"] = outcome(lambda p=pid: os.kill(p, 0))
        attempts[f"ptrace {who}"] = outcome(lambda p=pid: ptrace_attach(p))
        attempts[f"{who} root link"] = outcome(
            lambda p=pid: read(f"/proc/{p}/root{targets['seed_map']}")
        )
    schema = json.dumps({"type": "boolean"})
    script = (
        b"import json, os\n"
        b"json.dump(os.path.exists('/query/repo/README.md'), open('/query/out', 'w'))\n"
    )
    done = subprocess.run(
        ["bounded-query", "--repo", "octo/alpha", "--schema", schema],
        input=script,
        capture_output=True,
        check=False,
    )
    report = {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": os.getgroups(),
        "attempts": attempts,
        "environ": base64.b64encode(json.dumps(dict(os.environ)).encode()).decode(),
        "proc": proc_dump(),
        "query": done.stdout.decode("utf-8", "replace"),
    }
    tmp = os.path.join(workspace, "report.json.tmp")
    with open(tmp, "w") as handle:
        json.dump(report, handle)
    os.replace(tmp, os.path.join(workspace, "report.json"))


if __name__ == "__main__":
    main()
