"""The agent cannot read what it may only ask about (issue 8), from the agent's side.

Each test runs the real ``bounded-query-harness run`` as a separate process
(the token in its start-up environment, as in CI), staging two repositories
(internal and sealed) over HTTP with a real token through GIT_ASKPASS, with
the real broker and query runtime. The agent command is
``agent_probe.py``: it attacks the private root, every seed, the seed map,
the broker config, the journal, the audit log, the Docker socket, and
signals and ptraces the harness and the broker, then asks one real
question. While it runs, this test scans every process on the machine for
the token (``/proc/*/environ`` and ``/proc/*/cmdline``): after staging only
the clone children may ever have held it, and they are gone.

Modes: the agent container (on both query runtimes, and with the compose
broker of `run --compose`), a host agent as an
unprivileged user (``--agent-on-host --agent-user``), and the unconfined
host agent, which is reported degraded (and shows what the README's table
says it can reach).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.bq_harness_helpers import GitHttpServer, make_repo, publish, var_tmp_base

pytestmark = pytest.mark.engine

PROBE = Path(__file__).with_name("agent_probe.py")
AGENT_IMAGE = "bounded-query-agent:latest"
QUERY_IMAGE = "bounded-query-python:latest"
#: Unprivileged ids no account uses on the test machines.
CONTAINER_UID = 20001
HOST_UID = 20002
WAIT_S = 180


@pytest.fixture
def engine(docker_client):
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the confinement tests need root under CI=true")
        pytest.skip("the confinement tests need root (a harness switching users)")
    for image in (AGENT_IMAGE, QUERY_IMAGE):
        try:
            docker_client.images.get(image)
        except Exception:
            pytest.fail(f"{image} is missing: run .ci/build-images")
    return docker_client


@contextlib.contextmanager
def workspace_for(uid: int) -> Iterator[Path]:
    """A workspace under /var/tmp owned by ``uid`` (outside /tmp's 0700 trees)."""
    path = Path(tempfile.mkdtemp(prefix="bq-confine-ws-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    shutil.copyfile(PROBE, path / "agent_probe.py")
    os.chmod(path / "agent_probe.py", 0o444)
    os.chown(path, uid, uid)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def proc_holders(needle: bytes, skip: set[int]) -> list[str]:
    """Every process (except ``skip``) whose environ or cmdline contains ``needle``."""
    hits = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        for part in ("environ", "cmdline"):
            with contextlib.suppress(OSError):
                if needle in (entry / part).read_bytes():
                    hits.append(f"{entry.name}/{part}")
    return hits


#: Staging children: the clone and its helpers (the only ones that may hold it).
#: ``askpass.sh`` is the staging askpass helper git runs (``/bin/sh askpass.sh
#: PROMPT``); it inherits git's environment, so it holds the token as git does.
STAGING_PROGRAMS = (b"git", b"git-remote-http", b"git-remote-https", b"askpass.sh")


def program_of(cmdline: bytes) -> bytes:
    """The program a command line runs: argv[0]'s name, or the script a shell runs."""
    argv = cmdline.split(b"\0")
    program = os.path.basename(argv[0])
    if program in (b"sh", b"dash", b"bash") and len(argv) > 1:
        script = os.path.basename(argv[1])
        if script == b"askpass.sh":
            return script
    return program


class TokenWatch(threading.Thread):
    """Scans every process for the token, over and over, for the whole run."""

    def __init__(self, needle: bytes, skip: set[int]) -> None:
        super().__init__(daemon=True)
        self.needle, self.skip = needle, skip
        self.done = threading.Event()
        #: (monotonic time, pid, "environ"|"cmdline", argv[0] basename, full cmdline)
        self.hits: list[tuple[float, int, str, bytes, bytes]] = []
        self.scans = 0

    def _scan(self) -> None:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in self.skip:
                continue
            # The command line is read before and after: a process caught in
            # execve (a clone child leaving the harness's image for git's)
            # counts as what either read shows.
            with contextlib.suppress(OSError):
                before = (entry / "cmdline").read_bytes()
                environ = (entry / "environ").read_bytes()
                after = (entry / "cmdline").read_bytes()
                parts = [
                    name
                    for name, data in (("environ", environ), ("cmdline", before + after))
                    if self.needle in data
                ]
                programs = [program_of(c) for c in (before, after)]
                staging = [p for p in programs if p in STAGING_PROGRAMS]
                program = staging[0] if staging else programs[-1]
                for part in parts:
                    self.hits.append((time.monotonic(), int(entry.name), part, program, after))

    def run(self) -> None:
        while not self.done.is_set():
            self._scan()
            self.scans += 1
            time.sleep(0.005)


def broker_pid(private_root: Path) -> int:
    marker = str(private_root / "broker.json").encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "cmdline").read_bytes():
                    return int(entry.name)
    raise AssertionError("no broker process")


def wait_for(path: Path, harness: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert harness.poll() is None, f"the harness exited early ({harness.returncode})"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def run_probe(tmp_path: Path, runtime: str, mode: list[str], uid: int) -> dict:
    """Run the harness with the probe agent; the report plus what the test saw."""
    token = "tok-" + os.urandom(16).hex()
    source = tmp_path / "src"
    make_repo(source, {"README.md": "hello\n", "secret.txt": "the crown jewels\n"})
    served = tmp_path / "served"
    publish(source, served, "octo/alpha")
    publish(source, served, "octo/vault")
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "boundedQueries": {
                    "enabled": True,
                    "runtime": runtime,
                    "privateRepos": [
                        {"repo": "octo/alpha", "sensitivity": "internal"},
                        {"repo": "octo/vault", "sensitivity": "sealed"},
                    ],
                }
            }
        )
    )
    summary = tmp_path / "summary.md"
    stderr_path = tmp_path / "harness.err"
    with var_tmp_base() as base, workspace_for(uid) as ws, GitHttpServer(served, token) as server:
        env = {
            "PATH": os.environ["PATH"],
            "GH_TOKEN": token,
            "GITHUB_SERVER_URL": server.url,
            "GITHUB_STEP_SUMMARY": str(summary),
        }
        argv = [
            sys.executable,
            "-m",
            "bounded_query.harness",
            "run",
            "--config",
            str(config),
            "--allow-insecure-server-url",
            "--state-base",
            str(base),
            "--workspace",
            str(ws),
            *mode,
            "--",
            "python3",
            str(ws / "agent_probe.py"),
            str(ws),
        ]
        watch = TokenWatch(token.encode(), {os.getpid()})
        watch.start()
        with stderr_path.open("wb") as err:
            harness = subprocess.Popen(
                argv,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd="/",
            )
            try:
                wait_for(ws / "started", harness)
                agent_started = time.monotonic()
                [private_root] = base.glob("awf-bounded-query-private-*")
                seed_map = json.loads((private_root / "seed-map.json").read_text())
                seeds = [str(private_root / "seeds" / r["seedId"]) for r in seed_map["repos"]]
                broker = broker_pid(private_root)
                # The run is in full swing: the harness, the broker and the
                # agent are alive, staging is over. Nobody holds the token.
                holders = proc_holders(token.encode(), {os.getpid()})
                targets = {
                    "private_root": str(private_root),
                    "seeds": seeds,
                    "seed_map": str(private_root / "seed-map.json"),
                    "broker_config": str(private_root / "broker.json"),
                    "journal": str(private_root / "state" / "journal"),
                    "audit_log": str(private_root / "audit" / "audit.jsonl"),
                    "ready": str(private_root / "control" / "ready"),
                    "harness_pid": harness.pid,
                    "broker_pid": broker,
                }
                tmp_targets = ws / "targets.tmp"
                tmp_targets.write_text(json.dumps(targets))
                os.chmod(tmp_targets, 0o444)
                os.replace(tmp_targets, ws / "targets.json")
                status = harness.wait(timeout=WAIT_S)
            finally:
                watch.done.set()
                watch.join()
                if harness.poll() is None:
                    harness.kill()
                    harness.wait()
        report = json.loads((ws / "report.json").read_text())
        left = list(base.iterdir())
    stderr = stderr_path.read_text()
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    staging = [h for h in watch.hits if h[3] in STAGING_PROGRAMS]
    others = [h for h in watch.hits if h[3] not in STAGING_PROGRAMS]
    # The harness itself holds it only in its start-up block, until it wipes
    # it -- before it clones anything.
    early_harness = [
        h for h in others if h[1] == harness.pid and (not staging or h[0] < staging[0][0])
    ]
    return {
        "status": status,
        "report": report,
        "holders": holders,
        "token": token,
        "watch": {
            "scans": watch.scans,
            "staging_children": sorted({h[3].decode() for h in staging}),
            "others": [(h[1], h[2], h[4][:200]) for h in others if h not in early_harness],
            "after_agent_started": [h[1] for h in watch.hits if h[0] >= agent_started],
        },
        "events": events,
        "stderr": stderr,
        "left": left,
        "summary": summary.read_text() if summary.exists() else "",
    }


def token_in_report(report: dict, token: str) -> list[str]:
    found = []
    if token.encode() in base64.b64decode(report["environ"]):
        found.append("own environment")
    found += [
        key for key, data in report["proc"].items() if token.encode() in base64.b64decode(data)
    ]
    return found


def assert_token_only_in_staging_children(result: dict) -> None:
    """Over the whole run, only clone children held the token, and none once the agent ran."""
    watch = result["watch"]
    assert watch["scans"] > 10
    assert watch["others"] == []
    assert watch["after_agent_started"] == []


def assert_confined(result: dict, uid: int) -> None:
    report = result["report"]
    assert result["status"] == 0, result["stderr"][-3000:]
    assert report["uid"] == uid
    assert report["uid"] != 0
    assert report["groups"] in ([], [uid])
    reached = {k: v for k, v in report["attempts"].items() if not v.startswith("denied")}
    assert reached == {}
    assert len(report["attempts"]) >= 20
    assert token_in_report(report, result["token"]) == []
    assert result["holders"] == []
    assert_token_only_in_staging_children(result)
    assert report["query"] == '{"status":"ok","result":true}\n'
    assert result["left"] == []
    assert not any(
        e["event"] == "degraded" and e.get("subsystem") == "agent" for e in result["events"]
    )


@pytest.mark.parametrize(
    ("runtime", "broker"),
    [("docker", []), ("gvisor", []), ("docker", ["--compose"])],
    ids=["docker", "gvisor", "compose-broker"],
)
def test_agent_container_reaches_nothing_and_still_asks(engine, tmp_path, runtime, broker):
    result = run_probe(tmp_path, runtime, broker, CONTAINER_UID)
    assert_confined(result, CONTAINER_UID)
    mode = next(e for e in result["events"] if e["event"] == "agent_mode")
    assert mode["mode"] == "container"
    assert mode["user"] == f"{CONTAINER_UID}:{CONTAINER_UID}"
    # Its own PID namespace: none of the harness's processes is visible.
    pids = {int(key.split("/")[0]) for key in result["report"]["proc"]}
    assert len(pids) <= 4, pids
    label = "bounded-query.role=agent"
    assert engine.containers.list(all=True, filters={"label": label}) == []


@pytest.mark.parametrize("runtime", ["docker", "gvisor"])
def test_host_agent_as_unprivileged_user_reaches_nothing_and_still_asks(engine, tmp_path, runtime):
    mode = ["--agent-on-host", "--agent-user", f"{HOST_UID}:{HOST_UID}"]
    result = run_probe(tmp_path, runtime, mode, HOST_UID)
    assert_confined(result, HOST_UID)
    event = next(e for e in result["events"] if e["event"] == "agent_mode")
    assert event == {**event, "mode": "host", "user": f"{HOST_UID}:{HOST_UID}"}


def test_unconfined_host_agent_is_reported_degraded(engine, tmp_path):
    result = run_probe(tmp_path, "docker", ["--agent-on-host", "--unconfined-agent"], 0)
    report = result["report"]
    assert result["status"] == 0, result["stderr"][-3000:]
    assert report["uid"] == 0
    assert "DEGRADED" in result["stderr"]
    assert any(e["event"] == "degraded" and e["subsystem"] == "agent" for e in result["events"])
    assert "unconfined-agent" in result["summary"]
    # What the README's table says: unconfined, it reaches the private state...
    for name in (
        "read seed_map",
        "read journal",
        "write journal",
        "connect docker socket",
        "read broker environ",
    ):
        assert report["attempts"][name] == "reached", name
    # ...but even then the token is in no process's environment any more.
    assert token_in_report(report, result["token"]) == []
    assert result["holders"] == []
    assert_token_only_in_staging_children(result)
    assert report["query"] == '{"status":"ok","result":true}\n'


def test_host_agent_as_root_is_refused(engine, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "boundedQueries": {
                    "enabled": True,
                    "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}],
                }
            }
        )
    )
    with var_tmp_base() as base:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bounded_query.harness",
                "run",
                "--config",
                str(config),
                "--seed-source",
                f"octo/alpha={tmp_path}",
                "--state-base",
                str(base),
                "--agent-on-host",
                "--",
                "true",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert list(base.iterdir()) == []
    assert done.returncode == 2
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    [error] = [e for e in events if e["event"] == "preflight_error"]
    assert error["location"] == "--agent-on-host"
    assert "--agent-user" in error["hint"]
