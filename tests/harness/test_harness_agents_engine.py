"""Bounded agents in a real run on the real engine (harness/lifecycle/agents.py; spec 15.1, 15.6).

* A run with bounded agents (claude, runc) and a host agent: while the
  agent runs, the enclave network is internal with no bridge address, the
  API proxy is on it at its fixed address under its alias and on its
  egress bridge, read-only, without capabilities, as 65534, and ready
  (its control socket answers, unarmed); the agent finds the three
  ``AWF_BOUNDED_AGENT_*`` variables, and the agent socket answers its
  frame for an unknown repository with the canonical error. The real
  credential is nowhere but the proxy's 0400 file: not in the agent's
  environment, not in any other file of any root, not in ``docker
  inspect`` of any container of the run, not in the events or the
  summary. Afterwards nothing of the run is left: no root, container or
  network.
* A harness SIGKILLed while its agent runs, with an enclave-labelled
  container started by hand on the enclave network: within the reap limit
  the reaper leaves no agent root, no proxy, no enclave, no network; the
  next sweep finds nothing.
"""

from __future__ import annotations

import io
import ipaddress
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from bounded_query.broker.protocol.policy import (
    DEFAULT_IMAGE,
    ENCLAVE_API_PROXY_ALIAS,
    ENV_AGENT_REPOS,
    ENV_AGENT_SKILL,
    ENV_AGENT_SOCKET,
    LABEL_AGENT_HARNESS,
    LABEL_AGENT_RUN,
    LABEL_ROLE,
    LABEL_RUN,
)
from bounded_query.harness import RunOptions, run
from bounded_query.harness.configuration.apiproxy_image import APIPROXY_IMAGE, APIPROXY_UID
from bounded_query.harness.lifecycle import orchestrate
from bounded_query.harness.lifecycle.agents import ROLE_API_PROXY
from bounded_query.harness.lifecycle.sweep import SweepResult, sweep_stale_roots
from bounded_query.harness.records.events import EventSink
from tests.harness.agents_engine import HARNESS_SCRIPT, agent_broker_starter, with_agents
from tests.harness.bq_harness_helpers import HOST_AGENT, make_repo, var_tmp_base, wait_gone

pytestmark = pytest.mark.engine

CREDENTIAL = "sk-ant-api03-REALCRED-" + os.urandom(12).hex()
#: How long a SIGKILLed run's resources may take to go (the reaper's bound).
REAP_LIMIT_S = 30.0
START_LIMIT_S = 120.0
REPO_ROOT = Path(__file__).resolve().parents[2]
AGENT_IMAGE = "bounded-query-agent:latest"
#: The agent's uid (the workspace's owner: the container agent runs as it).
AGENT_UID = 20004

AGENT = r"""
import base64, json, os, socket, sys, time
out, gate = sys.argv[1], sys.argv[2]
report = {k: os.environ.get(k) for k in (
    "AWF_BOUNDED_AGENT_SOCKET", "AWF_BOUNDED_AGENT_SKILL", "AWF_BOUNDED_AGENT_REPOS",
    "ANTHROPIC_API_KEY")}
schema = base64.urlsafe_b64encode(b'{"type":"boolean"}').rstrip(b"=")
task = b"does the README exist?"
request = (b"POST /query HTTP/1.1\r\nhost: localhost\r\nx-awf-agent-version: 1\r\n"
           b"x-awf-repo: octo/nope\r\nx-awf-schema-b64: " + schema + b"\r\n"
           b"content-length: " + str(len(task)).encode() + b"\r\nconnection: close\r\n\r\n" + task)
with socket.socket(socket.AF_UNIX) as sock:
    sock.settimeout(60)
    sock.connect(report["AWF_BOUNDED_AGENT_SOCKET"])
    sock.sendall(request)
    data = b""
    while part := sock.recv(65536):
        data += part
report["response"] = data.partition(b"\r\n\r\n")[2].decode()
report["status_line"] = data.split(b"\r\n", 1)[0].decode()
json.dump(report, open(out, "w"))
while not os.path.exists(gate):
    time.sleep(0.05)
# The attacker's side: the test names what the agent must not reach.
try:
    targets = json.load(open(gate))
except ValueError:
    sys.exit(0)
probe = {}
def exchange(address):
    # What an unarmed proxy would answer, or whatever else is at that address.
    try:
        with socket.create_connection((address, targets["port"]), timeout=3) as sock:
            sock.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: awf-api-proxy:8080\r\n"
                         b"content-length: 0\r\nconnection: close\r\n\r\n")
            data = b""
            while len(data) < 4096:
                part = sock.recv(4096)
                if not part:
                    break
                data += part
            return data.decode("latin-1")
    except OSError as exc:
        return type(exc).__name__
probe["proxy_tcp"] = exchange(targets["address"])
probe["nobody_tcp"] = exchange(targets["nobody"])
for name, path in targets["files"].items():
    try:
        open(path, "rb").read()
        probe[name] = "read"
    except OSError as exc:
        probe[name] = type(exc).__name__
try:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(3)
        sock.connect(targets["control"])
    probe["control"] = "connected"
except OSError as exc:
    probe["control"] = type(exc).__name__
json.dump(probe, open(out + ".probe", "w"))
"""


@pytest.fixture
def engine(docker_client):
    for image in (DEFAULT_IMAGE, APIPROXY_IMAGE):
        try:
            docker_client.images.get(image)
        except Exception:
            pytest.fail(f"{image} is missing: run .ci/build-images (make images)")
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the bounded-agent engine tests need root under CI=true")
        pytest.skip("the bounded-agent engine tests need root")
    return docker_client


def _config(tmp: Path) -> Path:
    config = tmp / "c.json"
    section = {
        "enabled": True,
        "runtime": "docker",
        "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}],
    }
    config.write_text(json.dumps({"boundedQueries": section}))
    return config


def _run_objects(client: Any, run_id: str) -> list[str]:
    """Every container and network of ``run_id`` the run's labels name."""
    api = client.api
    found = []
    for label in (LABEL_RUN, LABEL_AGENT_RUN, LABEL_AGENT_HARNESS):
        for entry in api.containers(all=True, filters={"label": f"{label}={run_id}"}):
            found.append(f"container {entry['Names'][0]}")
    for entry in api.networks(filters={"label": f"{LABEL_AGENT_HARNESS}={run_id}"}) or ():
        found.append(f"network {entry['Name']}")
    return found


def _proxy_of(client: Any, base: Path) -> dict[str, Any] | None:
    """``docker inspect`` of the API proxy whose mounts are below ``base``."""
    for entry in client.api.containers(filters={"label": f"{LABEL_ROLE}={ROLE_API_PROXY}"}):
        info = client.api.inspect_container(entry["Id"])
        if any(m["Source"].startswith(str(base) + "/") for m in info["Mounts"]):
            return dict(info)
    return None


def _files_holding(root: Path, needle: bytes) -> list[str]:
    holding = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            if needle in path.read_bytes():
                holding.append(str(path.relative_to(root)))
    return holding


def _inspect_live_run(client: Any, base: Path) -> dict[str, Any]:
    """Everything the first test asserts about the live run (blocking)."""
    proxy = _proxy_of(client, base)
    assert proxy is not None, "no API proxy of this run"
    run_id = proxy["Config"]["Labels"][LABEL_AGENT_HARNESS]
    api = client.api
    inspected = [
        json.dumps(api.inspect_container(entry["Id"]))
        for label in (LABEL_RUN, LABEL_AGENT_RUN, LABEL_AGENT_HARNESS)
        for entry in api.containers(all=True, filters={"label": f"{label}={run_id}"})
    ]
    networks = {
        entry["Name"]: api.inspect_network(entry["Id"])
        for entry in api.networks(filters={"label": f"{LABEL_AGENT_HARNESS}={run_id}"})
    }
    roots = sorted(p for p in base.iterdir() if "bounded-agent" in p.name)
    private = next(p for p in roots if "-private-" in p.name)
    credential_file = private / "proxy" / "credential"
    return {
        "run_id": run_id,
        "proxy": proxy,
        "inspected": inspected,
        "networks": networks,
        "roots": [p.name for p in roots],
        "private_mode": stat.S_IMODE(os.lstat(private).st_mode),
        "credential_stat": os.lstat(credential_file),
        "holding": [
            h for root in base.iterdir() for h in _files_holding(root, CREDENTIAL.encode())
        ],
        "control_socket": stat.S_ISSOCK(os.lstat(private / "proxy" / "control" / "sock").st_mode),
        "targets": {
            "address": _enclave_address(proxy),
            # An address of the same subnet where nothing is (the comparison:
            # this machine's network may answer any TCP connection itself).
            "nobody": str(ipaddress.ip_address(_enclave_address(proxy)) + 9),
            "port": 8080,
            "files": {
                "credential": str(credential_file),
                "proxy_config": str(private / "proxy" / "proxy.json"),
                "agent_seed_map": str(private / "seed-map.json"),
            },
            "control": str(private / "proxy" / "control" / "sock"),
        },
    }


def _undated(response: str) -> str:
    """A response without its ``date`` header (two requests may straddle a second)."""
    return "\r\n".join(
        line for line in response.split("\r\n") if not line.lower().startswith("date:")
    )


def _enclave_address(proxy: dict[str, Any]) -> str:
    networks = proxy["NetworkSettings"]["Networks"]
    return str(next(v["IPAddress"] for k, v in networks.items() if "egress" not in k))


@pytest.mark.parametrize("mode", ["host", "container"])
async def test_a_run_with_bounded_agents_serves_the_agent_socket_and_keeps_the_credential(
    engine, tmp_path, monkeypatch, mode
):
    if mode == "container":
        try:
            engine.images.get(AGENT_IMAGE)
        except Exception:
            pytest.fail(f"{AGENT_IMAGE} is missing: run .ci/build-images")
    monkeypatch.setattr(orchestrate, "load_reported", with_agents())
    source = tmp_path / "src"
    make_repo(source, {"README.md": "hello\n"})
    workspace = Path(tempfile.mkdtemp(prefix="bq-agents-ws-", dir="/var/tmp"))
    os.chmod(workspace, 0o755)
    os.chown(workspace, AGENT_UID, AGENT_UID)
    report, gate = workspace / "report.json", workspace / "gate"
    (workspace / "agent.py").write_text(AGENT)
    python = sys.executable if mode == "host" else "python3"
    summary = tmp_path / "summary.md"
    stream = io.StringIO()
    live: dict[str, Any] = {}
    status: list[int] = []
    with var_tmp_base() as base:
        options = RunOptions(
            config_source=str(_config(tmp_path)),
            agent=(python, str(workspace / "agent.py"), str(report), str(gate)),
            seed_sources={"octo/alpha": source},
            workspace=workspace,
            base=base,
            allow_insecure_api_target=True,  # the test target is http (nothing is forwarded)
            **(HOST_AGENT if mode == "host" else {}),
        )
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(REPO_ROOT),
            "ANTHROPIC_API_KEY": CREDENTIAL,
            "GITHUB_STEP_SUMMARY": str(summary),
        }

        async def harness() -> None:
            status.append(await run(options, EventSink(stream), env, None, agent_broker_starter))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(harness)
            try:
                with trio.move_on_after(START_LIMIT_S):
                    # A file, not an event: poll.
                    while not report.exists() and not status:  # noqa: ASYNC110
                        await trio.sleep(0.1)
                if report.exists() and not status:
                    live.update(await trio.to_thread.run_sync(_inspect_live_run, engine, base))
            finally:
                staged = gate.with_name("gate.tmp")
                staged.write_text(json.dumps(live["targets"]) if live else "go")
                staged.rename(gate)
        assert os.listdir(base) == []
    seen = json.loads(report.read_text()) if report.exists() else {}
    probe_file = report.with_name(report.name + ".probe")
    probe = json.loads(probe_file.read_text()) if probe_file.exists() else {}
    shutil.rmtree(workspace, ignore_errors=True)
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    notable = [e for e in events if "fail" in e["event"] or "error" in e["event"]]
    assert status == [0], json.dumps(notable or events[-8:])
    # The agent's view (spec 15.8) and the canonical refusal (spec 15.3).
    assert seen["AWF_BOUNDED_AGENT_REPOS"] == "octo/alpha"
    assert "awf-bounded-agent-ingress-" in seen[ENV_AGENT_SOCKET]
    assert seen[ENV_AGENT_SKILL].endswith("/skill/SKILL.md")
    assert "awf-bounded-agent-ingress-" in seen[ENV_AGENT_SKILL]
    assert seen["ANTHROPIC_API_KEY"] is None
    assert seen["status_line"] == "HTTP/1.1 200 OK"
    assert seen["response"] == '{"status":"error"}'
    assert ENV_AGENT_REPOS in seen
    # From the agent's side: the proxy's enclave address is unreachable (an
    # internal network without a bridge address); in its container nothing of
    # the agent private root exists (the unconfined host agent is root: it
    # reads everything, which is why that mode is degraded).
    print(f"bounded-agent probe from the agent ({mode}):", json.dumps(probe)[:600])
    assert _undated(probe["proxy_tcp"]) == _undated(probe["nobody_tcp"]), probe
    assert "application/json" not in probe["proxy_tcp"], probe
    if mode == "container":
        assert probe["credential"] == "FileNotFoundError", probe
        assert probe["proxy_config"] == "FileNotFoundError", probe
        assert probe["agent_seed_map"] == "FileNotFoundError", probe
        assert probe["control"] in ("FileNotFoundError", "ConnectionRefusedError"), probe
    # The live topology (spec 15.6).
    run_id = live["run_id"]
    proxy = live["proxy"]
    host = proxy["HostConfig"]
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert proxy["Config"]["User"] == f"{APIPROXY_UID}:{APIPROXY_UID}"
    assert LABEL_AGENT_RUN not in proxy["Config"]["Labels"]
    attached = proxy["NetworkSettings"]["Networks"]
    enclave_net = next(
        n for n in attached if n.startswith("awf-bounded-agent-") and "egress" not in n
    )
    egress_net = next(n for n in attached if "egress" in n)
    assert len(attached) == 2
    endpoint = attached[enclave_net]
    assert ENCLAVE_API_PROXY_ALIAS in endpoint["Aliases"]
    assert endpoint["IPAMConfig"]["IPv4Address"] == endpoint["IPAddress"]
    assert endpoint["IPAddress"].startswith("10.213.")
    enclave_info = live["networks"][enclave_net]
    assert enclave_info["Internal"] is True
    assert enclave_info["Options"]["com.docker.network.bridge.inhibit_ipv4"] == "true"
    assert live["networks"][egress_net]["Internal"] is False
    assert live["control_socket"]
    assert [r.split("-")[3] for r in live["roots"]] == ["ingress", "private"]
    assert live["private_mode"] == 0o700
    cred = live["credential_stat"]
    assert stat.S_IMODE(cred.st_mode) == 0o400
    assert cred.st_uid == APIPROXY_UID
    # The credential: its own file only; no container, event or summary.
    assert live["holding"] == ["proxy/credential"]
    assert live["inspected"]
    assert not [text for text in live["inspected"] if CREDENTIAL in text]
    assert CREDENTIAL not in stream.getvalue()
    summary_text = summary.read_text()
    assert CREDENTIAL not in summary_text
    assert "### Bounded agents" in summary_text
    assert "API proxy usage records" in summary_text
    names = [e["event"] for e in events]
    for expected in ("agent_network_created", "api_proxy_ready", "agent_started"):
        assert expected in names, expected
    agent_events = [e for e in events if e.get("subsystem") == "bounded-agent"]
    assert {"broker_ready", "broker_stopped", "roots_removed"} <= {e["event"] for e in agent_events}
    relayed = [e for e in events if e["_schema"] == "bounded-query-broker/v1"]
    assert any(e.get("subsystem") == "bounded-agent" for e in relayed)
    stamps = {e["event"]: e["timestamp"] for e in events if e.get("subsystem") == "bounded-agent"}
    print(f"bounded-agent setup ({mode}):", {k: stamps.get(k) for k in _SETUP_EVENTS})
    # Nothing of the run is left.
    assert _run_objects(engine, run_id) == []


_SETUP_EVENTS = (
    "agent_network_created",
    "api_proxy_started",
    "api_proxy_ready",
    "broker_started",
    "broker_ready",
)


def _events(path: Path) -> list[dict[str, Any]]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "event" in doc:
            found.append(doc)
    return found


def test_a_sigkilled_harness_leaves_no_proxy_enclave_network_or_agent_root(engine, tmp_path):
    source = tmp_path / "src"
    make_repo(source, {"README.md": "hi\n"})
    stderr = tmp_path / "stderr"
    workspace = Path(tempfile.mkdtemp(prefix="bq-agents-ws-", dir="/var/tmp"))
    by_hand = None
    run_id = ""
    harness = None
    try:
        with var_tmp_base() as base, open(stderr, "wb") as err:
            env = {
                "PATH": os.environ["PATH"],
                "PYTHONPATH": str(REPO_ROOT),
                "ANTHROPIC_API_KEY": CREDENTIAL,
            }
            harness = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    HARNESS_SCRIPT,
                    str(_config(tmp_path)),
                    str(source),
                    str(base),
                    str(workspace),
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
            deadline = time.monotonic() + START_LIMIT_S
            while not any(e["event"] == "agent_started" for e in _events(stderr)):
                assert harness.poll() is None, stderr.read_text()[-3000:]
                assert time.monotonic() < deadline, stderr.read_text()[-3000:]
                time.sleep(0.1)
            proxy = _proxy_of(engine, base)
            assert proxy is not None
            run_id = proxy["Config"]["Labels"][LABEL_AGENT_HARNESS]
            network = next(n for n in proxy["NetworkSettings"]["Networks"] if "egress" not in n)
            # An enclave the agent broker had started (labelled as the runner labels them).
            by_hand = engine.containers.create(
                DEFAULT_IMAGE,
                ["sleep", "300"],
                labels={LABEL_AGENT_RUN: run_id},
                network=network,
            )
            by_hand.start()
            before = _run_objects(engine, run_id)
            assert f"container /{by_hand.name}" in before
            assert f"container /{proxy['Name'].lstrip('/')}" in before
            assert len([b for b in before if b.startswith("network ")]) == 2, before
            assert len([p for p in base.iterdir() if "bounded-agent" in p.name]) == 2
            armed = next(e for e in _events(stderr) if e["event"] == "reaper_armed")
            killed = time.monotonic()
            os.kill(harness.pid, signal.SIGKILL)
            harness.wait()
            left: list[str] = []
            while time.monotonic() < killed + REAP_LIMIT_S:
                left = _run_objects(engine, run_id) + [p.name for p in base.iterdir()]
                if not left:
                    break
                time.sleep(0.05)
            seconds = time.monotonic() - killed
            assert left == [], left
            assert seconds < REAP_LIMIT_S
            print(f"bounded-agent reap after SIGKILL: {seconds:.2f} s")
            wait_gone(int(armed["pid"]), REAP_LIMIT_S)
            reaped = next(e for e in _events(stderr) if e["event"] == "reaper_reaped")
            assert reaped["roots"] == "removed"
            assert reaped["engine"] == "reconciled"
            assert _brokers_under(base) == []
            sink = EventSink(io.StringIO())
            assert sweep_stale_roots(base, os.getuid(), sink) == SweepResult()
            assert CREDENTIAL not in stderr.read_text(errors="replace")
    finally:
        if harness is not None and harness.poll() is None:
            os.killpg(harness.pid, signal.SIGKILL)
            harness.wait()
        if run_id:
            for kind in ("containers", "networks"):
                _force_remove(engine, kind, run_id)
        shutil.rmtree(workspace, ignore_errors=True)


def _brokers_under(base: Path) -> list[int]:
    """Live broker processes whose command line names a config below ``base``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"bounded-query-broker" in cmdline and str(base).encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def _force_remove(client: Any, kind: str, run_id: str) -> None:
    """Remove what this test's run left (by its labels only)."""
    api = client.api
    if kind == "containers":
        for label in (LABEL_RUN, LABEL_AGENT_RUN, LABEL_AGENT_HARNESS):
            for entry in api.containers(all=True, filters={"label": f"{label}={run_id}"}):
                try:
                    api.remove_container(entry["Id"], force=True, v=True)
                except Exception:  # gone meanwhile
                    continue
        return
    for entry in api.networks(filters={"label": f"{LABEL_AGENT_HARNESS}={run_id}"}) or ():
        try:
            api.remove_network(entry["Id"])
        except Exception:  # gone meanwhile
            continue
