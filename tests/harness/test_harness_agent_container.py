"""The agent container's lifecycle through ``run`` (issue 8; ``harness/agent/launch.py``).

Real containers from the built-in agent image, the real broker daemon with
the fake query runner (no query containers needed): exit status, stdout and
stderr on the harness's own, a forwarded signal, the stop grace for an agent
that ignores it, a terminal passed through (``-it``-like), teardown by run
label, and the sweep of agent containers a killed harness left behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import pty
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bounded_query.broker.protocol.policy import LABEL_OWNER, LABEL_ROLE, LABEL_RUN
from bounded_query.harness import RunOptions, run
from bounded_query.harness.agent.launch import sweep_agent_containers
from bounded_query.harness.agent.spec import ROLE_AGENT
from bounded_query.harness.lifecycle.sweep import MODE_RUN, OwnerRecord, current_owner
from bounded_query.harness.records.events import EventSink
from bounded_query.sandbox.cpus import agent_cpus
from tests.harness.bq_harness_helpers import (
    FAKE_BROKER,
    HARNESS_TESTS_ROOT,
    make_repo,
    var_tmp_base,
)
from tests.harness.test_harness_run import run_and_signal

pytestmark = pytest.mark.engine

AGENT_IMAGE = "bounded-query-agent:latest"
AGENT_UID = 20001


@pytest.fixture
def engine(docker_client):
    try:
        docker_client.images.get(AGENT_IMAGE)
    except Exception:
        pytest.fail(f"{AGENT_IMAGE} is missing: run .ci/build-images")
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("agent container tests need root under CI=true")
        pytest.skip("agent container tests need root")
    return docker_client


@contextlib.contextmanager
def workspace() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="bq-agent-ws-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    os.chown(path, AGENT_UID, AGENT_UID)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def setup(tmp_path, engine):
    source = tmp_path / "src"
    make_repo(source, {"README.md": "hi\n"})
    config = tmp_path / "c.json"
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
    with var_tmp_base() as base, workspace() as ws:
        yield {
            "base": base,
            "ws": ws,
            "config": config,
            "source": source,
            "env": {"PATH": os.environ["PATH"], "PYTHONPATH": str(HARNESS_TESTS_ROOT)},
            "client": engine,
        }


def options(setup: dict, agent: tuple[str, ...], **extra: object) -> RunOptions:
    return RunOptions(
        config_source=str(setup["config"]),
        agent=agent,
        seed_sources={"octo/alpha": setup["source"]},
        workspace=setup["ws"],
        base=setup["base"],
        broker_command=FAKE_BROKER,
        probe_runtime=False,
        agent_tty=False,
        **extra,  # type: ignore[arg-type]
    )


def agent_containers(client) -> list[str]:
    found = client.containers.list(all=True, filters={"label": f"{LABEL_ROLE}={ROLE_AGENT}"})
    return [c.name for c in found]


async def test_exit_status_and_both_streams_reach_the_harness(setup, capfd):
    code = "import sys; print('to-stdout'); print('to-stderr', file=sys.stderr); sys.exit(7)"
    stream = io.StringIO()
    status = await run(options(setup, ("python3", "-c", code)), EventSink(stream), setup["env"])
    out, err = capfd.readouterr()
    assert status == 7, stream.getvalue()
    assert "to-stdout" in out
    assert "to-stdout" not in err
    assert "to-stderr" in err
    assert "to-stderr" not in out
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    started = next(e for e in events if e["event"] == "agent_started")
    assert "container" in started
    assert agent_containers(setup["client"]) == []
    assert list(setup["base"].iterdir()) == []


async def test_a_missing_image_is_a_harness_failure(setup):
    stream = io.StringIO()
    status = await run(
        options(setup, ("true",), agent_image="bq-no-such-image:latest"),
        EventSink(stream),
        setup["env"],
    )
    assert status == 2
    assert "agent_failed_to_start" in stream.getvalue()
    assert list(setup["base"].iterdir()) == []


async def test_a_missing_image_fails_preflight_before_staging(setup):
    stream = io.StringIO()
    opts = dataclasses.replace(
        options(setup, ("true",), agent_image="bq-no-such-image:latest"), probe_runtime=True
    )
    status = await run(opts, EventSink(stream), setup["env"])
    assert status == 2
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    [error] = [e for e in events if e["event"] == "preflight_error"]
    assert error["location"] == "--agent-image"
    assert "images" in error["hint"]
    assert "staging_started" not in [e["event"] for e in events]
    assert list(setup["base"].iterdir()) == []


async def test_the_agent_sees_only_its_three_mounts_and_the_image(setup):
    code = (
        "import json, os\n"
        "mounts = [l.split()[4] for l in open('/proc/self/mountinfo')]\n"
        "json.dump({'mounts': mounts, 'caps': [l for l in open('/proc/self/status')\n"
        "           if l.startswith(('CapEff', 'CapPrm', 'NoNewPrivs', 'Cpus_allowed_list'))]},\n"
        f"          open({str(setup['ws'] / 'm.json')!r}, 'w'))\n"
    )
    status = await run(
        options(setup, ("python3", "-c", code)), EventSink(io.StringIO()), setup["env"]
    )
    assert status == 0
    seen = json.loads((setup["ws"] / "m.json").read_text())
    binds = [m for m in seen["mounts"] if m.startswith(("/var", "/work", "/root", "/run/d"))]
    assert len(binds) == 3, binds
    assert str(setup["ws"]) in binds
    assert sum(m.endswith("/run") for m in binds) == 1
    assert sum(m.endswith("/skill") for m in binds) == 1
    assert not any("docker.sock" in m for m in seen["mounts"])
    caps = dict(line.split(":\t") for line in seen["caps"])
    assert caps["CapEff"].strip() == "0000000000000000"
    assert caps["CapPrm"].strip() == "0000000000000000"
    assert caps["NoNewPrivs"].strip() == "1"
    # Pinned to the agent CPUs (sandbox/cpus.py), disjoint from the queries' when partitioned.
    assert caps["Cpus_allowed_list"].strip() == agent_cpus(os.cpu_count() or 1)


async def test_a_signal_is_forwarded_into_the_container(setup):
    marker = setup["ws"] / "started"
    got = setup["ws"] / "got-term"
    code = (
        "import pathlib, signal, sys, time\n"
        f"def on_term(*_): pathlib.Path({str(got)!r}).write_text('x'); sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        f"pathlib.Path({str(marker)!r}).write_text('x')\n"
        "time.sleep(60)\n"
    )
    status, _text = await run_and_signal(
        options(setup, ("python3", "-c", code)),
        setup["env"],
        lambda _events: marker.exists(),
        signal.SIGTERM,
    )
    assert got.exists()
    assert status == 3
    assert agent_containers(setup["client"]) == []
    assert list(setup["base"].iterdir()) == []


async def test_an_agent_ignoring_the_signal_is_killed_after_the_grace(setup):
    marker = setup["ws"] / "started"
    code = (
        "import pathlib, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"pathlib.Path({str(marker)!r}).write_text('x')\n"
        "time.sleep(120)\n"
    )
    started = time.monotonic()
    status, text = await run_and_signal(
        options(setup, ("python3", "-c", code), stop_grace=1.0),
        setup["env"],
        lambda _events: marker.exists(),
        signal.SIGTERM,
    )
    assert status == 128 + signal.SIGTERM
    assert time.monotonic() - started < 60
    assert "agent_stopped" in text
    assert agent_containers(setup["client"]) == []
    assert list(setup["base"].iterdir()) == []


def test_a_terminal_on_stdin_is_passed_through(setup):
    """``-it``-like: the agent gets a TTY and reads what is typed."""
    code = "import os, sys; line = sys.stdin.readline(); print('got', line.strip(), os.isatty(0))"
    master, slave = pty.openpty()
    try:
        harness = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bounded_query.harness",
                "run",
                "--config",
                str(setup["config"]),
                "--seed-source",
                f"octo/alpha={setup['source']}",
                "--state-base",
                str(setup["base"]),
                "--workspace",
                str(setup["ws"]),
                "--",
                "python3",
                "-c",
                code,
            ],
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(HARNESS_TESTS_ROOT)},
        )
        os.write(master, b"hello\n")  # typed ahead, before the container exists
        try:
            out, err = harness.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            harness.terminate()  # the harness tears down on SIGTERM
            harness.communicate(timeout=60)
            raise
    finally:
        os.close(master)
        os.close(slave)
    assert harness.returncode == 0, err.decode()[-2000:]
    assert b"got hello True" in out
    assert agent_containers(setup["client"]) == []


def owner_label(record: OwnerRecord) -> str:
    return json.dumps(record.to_doc(), sort_keys=True)


def test_the_sweep_removes_agents_of_a_dead_harness_only(engine):
    child = subprocess.Popen(["true"])
    child.wait()
    me = current_owner(MODE_RUN)
    dead = OwnerRecord(MODE_RUN, child.pid, me.start_time + 1, me.boot_id, me.pid_namespace)
    made = []
    try:
        for name, label in (
            ("dead", owner_label(dead)),
            ("alive", owner_label(me)),
            ("garbage", "{not json"),
        ):
            container = engine.containers.create(
                AGENT_IMAGE,
                ["sleep", "30"],
                name=f"bq-sweep-test-{name}-{os.getpid()}",
                labels={LABEL_ROLE: ROLE_AGENT, LABEL_OWNER: label, LABEL_RUN: "sweep-test"},
            )
            made.append(container)
        stream = io.StringIO()
        removed = sweep_agent_containers("unix:///var/run/docker.sock", EventSink(stream))
        assert removed == 1
        left = {
            c.name
            for c in engine.containers.list(all=True, filters={"label": f"{LABEL_RUN}=sweep-test"})
        }
        pid = os.getpid()
        assert left == {f"bq-sweep-test-alive-{pid}", f"bq-sweep-test-garbage-{pid}"}
        assert "stale_agent_removed" in stream.getvalue()
    finally:
        for container in made:
            with contextlib.suppress(Exception):
                container.remove(force=True)
