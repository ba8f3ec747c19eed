"""The bounded-agent broker runs without a network (spec 15.6), from the child's side.

A child started the way the agent broker is (``_spawn_broker(...,
own_network=True)``) looks at its own world: its network namespace is not
the harness's, it has no interface but a loopback that is down, a TCP
listener the harness opened on 127.0.0.1 is unreachable from it, and a Unix
socket named by path (the kind its socket, the Docker socket and the proxy's
control socket are) still connects.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bounded_query.harness.lifecycle.broker_child import NO_NETWORK_NAMESPACE, _spawn_broker

PROBE = r"""
import json, os, socket, sys
out, port, unix_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
facts = {"netns": os.readlink("/proc/self/ns/net")}
lines = open("/proc/self/net/dev").read().splitlines()[2:]
facts["interfaces"] = sorted(line.split(":")[0].strip() for line in lines)
try:
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    facts["tcp"] = "connected"
except OSError as exc:
    facts["tcp"] = exc.errno
s = socket.socket(socket.AF_UNIX)
s.connect(unix_path)
facts["unix"] = s.recv(16).decode()
s.close()
json.dump(facts, open(out, "w"))
"""


def _require_root() -> None:
    if os.geteuid() == 0:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("a network namespace needs root, and CI runs as root")
    pytest.skip("a network namespace needs root")


def test_the_agent_broker_child_has_no_network_but_its_unix_sockets(tmp_path: Path) -> None:
    _require_root()
    tcp = socket.create_server(("127.0.0.1", 0))
    unix_path = str(tmp_path / "control.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    unix.listen(1)

    def answer() -> None:
        conn, _ = unix.accept()
        conn.sendall(b"hello")
        conn.close()

    server = threading.Thread(target=answer, daemon=True)
    server.start()
    out = tmp_path / "facts.json"
    argv = [sys.executable, "-c", PROBE, str(out), str(tcp.getsockname()[1]), unix_path]
    try:
        child = _spawn_broker(argv, {"PATH": os.environ["PATH"]}, None, own_network=True)
        assert child.wait(timeout=30) == 0
        facts = json.loads(out.read_text())
        server.join(timeout=10)
    finally:
        tcp.close()
        unix.close()
    assert facts["netns"] != os.readlink("/proc/self/ns/net")
    assert facts["interfaces"] == ["lo"]
    assert facts["tcp"] != "connected"
    assert facts["unix"] == "hello"


#: Run as uid 65534 (no CAP_SYS_ADMIN, so unshare fails): spawn a child that
#: asks for its own network namespace and would create a marker file.
UNPRIVILEGED = r"""
import os, sys
from bounded_query.harness.lifecycle.broker_child import _spawn_broker  # before: /root is closed
os.setgroups([]); os.setgid(65534); os.setuid(65534)
child = _spawn_broker(["touch", sys.argv[1]], {"PATH": "/usr/bin:/bin"}, None, own_network=True)
sys.exit(child.wait(timeout=30))
"""


def test_a_child_that_cannot_get_its_namespace_never_runs_the_broker(tmp_path: Path) -> None:
    """Fail closed: no namespace, no broker (the exit status says why)."""
    _require_root()  # to become an unprivileged user for the attempt
    tmp_path.chmod(0o777)
    marker = tmp_path / "ran"
    done = subprocess.run(
        [sys.executable, "-c", UNPRIVILEGED, str(marker)],
        capture_output=True,
        timeout=60,
        check=False,
        cwd="/",
    )
    assert done.returncode == NO_NETWORK_NAMESPACE, done.stderr.decode()[-2000:]
    assert not marker.exists()
