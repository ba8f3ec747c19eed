"""End to end with the real engine: ``run`` and ``compose`` (spec 14.6-14.8).

``run``: the repository is staged from the local git HTTP server with basic
auth (the askpass path), the real ``bounded-query-broker`` starts with the
docker runtime, an agent asks through the wrapper, everything is torn down.
``compose``: the broker image is built without a registry, ``docker-compose
up`` starts the broker service and the example agent service, a query runs
from inside the agent service, ``compose-down`` removes everything.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bounded_query.broker.protocol.policy import LABEL_HARNESS_RUN, LABEL_RUN
from bounded_query.harness import RunOptions, run
from bounded_query.harness.__main__ import main
from bounded_query.harness.records.events import EventSink
from tests.harness.bq_harness_helpers import (
    GitHttpServer,
    make_repo,
    publish,
    var_tmp_base,
)

pytestmark = pytest.mark.engine

QUERY_IMAGE = "bounded-query-python:latest"
SCRIPT = (
    "import json, os, subprocess\n"
    "n = int(subprocess.run(['git', '-C', '/query/repo', 'rev-list', '--count', 'HEAD'],\n"
    "                       capture_output=True, text=True).stdout)\n"
    "json.dump({'readme': os.path.exists('/query/repo/README.md'), 'commits': n},\n"
    "          open('/query/out', 'w'))\n"
)
SCHEMA = {
    "type": "object",
    "fields": {
        "readme": {"type": "boolean"},
        "commits": {"type": "integer", "minimum": 0, "maximum": 15},
    },
}
AGENT = r"""
import json, os, subprocess, sys
schema, script, out = sys.argv[1], sys.argv[2], sys.argv[3]
answers = []
for repo in ("octo/alpha", "octo/alpha", "octo/alpha"):
    done = subprocess.run(["bounded-query", "--repo", repo, "--schema", schema],
                          input=open(script, "rb").read(), capture_output=True, check=True)
    answers.append(done.stdout.decode())
json.dump({"answers": answers, "env": sorted(os.environ)}, open(out, "w"))
"""


@pytest.fixture
def engine(docker_client):
    try:
        docker_client.images.get(QUERY_IMAGE)
    except Exception:
        pytest.fail(f"{QUERY_IMAGE} is missing: run `make images`")
    return docker_client


#: The agent container's uid: the owner of the workspaces below (the default rule).
AGENT_UID = 20001


@contextlib.contextmanager
def agent_workspace() -> Iterator[Path]:
    """A workspace under /var/tmp owned by :data:`AGENT_UID` (the agent container's)."""
    path = Path(tempfile.mkdtemp(prefix="bq-engine-ws-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    os.chown(path, AGENT_UID, AGENT_UID)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def agent_argv(workspace: Path) -> tuple[str, ...]:
    """AGENT asking SCHEMA with SCRIPT (both in the workspace) three times, in its container."""
    (workspace / "script.py").write_text(SCRIPT)
    (workspace / "agent.py").write_text(AGENT)
    return (
        "python3",
        str(workspace / "agent.py"),
        json.dumps(SCHEMA),
        str(workspace / "script.py"),
        str(workspace / "report.json"),
    )


def leftover(client, label: str, value: str) -> list[str]:
    found = client.containers.list(all=True, filters={"label": f"{label}={value}"})
    return [c.name for c in found]


async def test_run_stages_over_http_and_answers_through_the_real_broker(engine, tmp_path):
    token = "tok-" + secrets.token_hex(16)
    source = tmp_path / "src"
    make_repo(source, {"README.md": "hello\n"}, commits=3)
    served = tmp_path / "served"
    publish(source, served, "octo/alpha")
    config = tmp_path / "config.yaml"
    config.write_text(
        "boundedQueries:\n  enabled: true\n  privateRepos:\n"
        "    - {repo: octo/alpha, sensitivity: confidential}\n"
    )
    stream = io.StringIO()
    with (
        var_tmp_base() as base,
        GitHttpServer(served, token) as server,
        agent_workspace() as workspace,
    ):
        env = {
            "PATH": os.environ["PATH"],
            "GH_TOKEN": token,
            "GITHUB_SERVER_URL": server.url,
            "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
        }
        options = RunOptions(
            config_source=str(config),
            agent=agent_argv(workspace),
            workspace=workspace,
            base=base,
            allow_insecure_server=True,
        )
        status = await run(options, EventSink(stream), env)
        assert list(base.iterdir()) == []
        report = json.loads((workspace / "report.json").read_text())
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert status == 0, events
    assert not server.token_seen_in_cmdline
    assert token not in stream.getvalue()
    # confidential = 8 bits: the first question costs 1 + 5 + 3 = 9 > 8 -> refused.
    # So use the ledger as the oracle: every answer is the canonical error.
    assert report["answers"] == ['{"status":"error"}\n'] * 3
    assert "GH_TOKEN" not in report["env"]
    run_id = next(e for e in events if e["event"] == "config_loaded")
    assert run_id
    # The real broker's own lines arrive as versioned records, not raw.
    relayed = [e["event"] for e in events if e["_schema"] == "bounded-query-broker/v1"]
    assert relayed[0] == "broker-ready"
    assert relayed[-1] == "broker-stopped"
    summary = (tmp_path / "summary.md").read_text()
    assert "| `octo/alpha` | confidential | 8 | 0 | 0 |" in summary
    assert "Refused before launch (any repository): 3" in summary


async def run_agent(
    tmp_path: Path, section: dict, commits: int, starter=None
) -> tuple[int, list[dict], list[str]]:
    """Run AGENT (three SCHEMA questions) against ``octo/alpha`` staged locally."""
    source = tmp_path / "src"
    make_repo(source, {"README.md": "hello\n"}, commits=commits)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"boundedQueries": section}))
    stream = io.StringIO()
    with var_tmp_base() as base, agent_workspace() as workspace:
        options = RunOptions(
            config_source=str(config),
            agent=agent_argv(workspace),
            seed_sources={"octo/alpha": source},
            workspace=workspace,
            base=base,
        )
        status = await run(options, EventSink(stream), {"PATH": os.environ["PATH"]}, starter)
        assert list(base.iterdir()) == []
        report = workspace / "report.json"
        answers = json.loads(report.read_text())["answers"] if report.exists() else []
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    return status, events, answers


ALPHA = {"enabled": True, "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}]}


async def test_run_answers_and_drains_the_ledger(engine, tmp_path):
    status, events, answers = await run_agent(tmp_path, ALPHA, commits=3)
    assert status == 0, events
    ok = '{"status":"ok","result":{"readme":true,"commits":3}}\n'
    assert answers == [ok, ok, ok]
    usage = next(e for e in events if e["event"] == "repo_usage")
    assert usage["spent"] == 27  # three times 1 + ceil(log2(32)) + 3 = 9
    assert usage["invocations"] == 3
    assert sum(usage["buckets"].values()) == 3


def test_compose_up_query_from_agent_service_and_down(engine, tmp_path, monkeypatch, capsys):
    source = tmp_path / "src"
    make_repo(source, {"README.md": "hello\n"}, commits=2)
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
    out = tmp_path / "compose"
    monkeypatch.chdir(tmp_path)
    with var_tmp_base() as base:
        status = main(
            [
                "compose",
                "--config",
                str(config),
                "--seed-source",
                f"octo/alpha={source}",
                "--out",
                str(out),
                "--state-base",
                str(base),
                "--up",
            ]
        )
        printed, err = capsys.readouterr()
        assert status == 0, err
        state = json.loads(printed)
        try:
            compose = ["docker-compose", "-p", state["project"], "-f", state["composeFile"]]
            document = json.loads(Path(state["composeFile"]).read_text())
            agent = document["services"]["agent"]
            assert agent["network_mode"] == "none"
            assert len(agent["volumes"]) == 3
            assert agent["volumes"][1].endswith(":ro")
            assert agent["volumes"][2] == f"{tmp_path}:{tmp_path}:rw"  # the workspace
            [container] = engine.containers.list(
                filters={
                    "label": [
                        f"com.docker.compose.project={state['project']}",
                        "com.docker.compose.service=agent",
                    ]
                }
            )
            host = container.attrs["HostConfig"]
            assert host["CapDrop"] == ["ALL"]
            assert host["SecurityOpt"] == ["no-new-privileges:true"]
            assert host["PidMode"] in ("", "private")
            assert host["Privileged"] is False
            assert host["ReadonlyRootfs"] is True
            assert container.attrs["Config"]["User"] == "65534:65534"
            sources = sorted(m["Source"] for m in container.attrs["Mounts"])
            assert sources == sorted(
                [str(tmp_path), state["ingressRoot"] + "/run", state["ingressRoot"] + "/skill"]
            )
            status_lines = subprocess.run(
                [
                    "docker-compose",
                    "-p",
                    state["project"],
                    "-f",
                    state["composeFile"],
                    "exec",
                    "-T",
                    "agent",
                    "cat",
                    "/proc/self/status",
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout
            assert "CapEff:\t0000000000000000" in status_lines
            assert "NoNewPrivs:\t1" in status_lines
            broker = document["services"]["bounded-query-broker"]
            assert broker["network_mode"] == "none"
            assert broker["restart"] == "unless-stopped"
            assert any(v.endswith("/seeds:ro") for v in broker["volumes"])
            done = subprocess.run(
                [
                    *compose,
                    "exec",
                    "-T",
                    "agent",
                    "bounded-query",
                    "--repo",
                    "octo/alpha",
                    "--schema",
                    json.dumps(SCHEMA),
                ],
                input=SCRIPT.encode(),
                capture_output=True,
                check=False,
                timeout=120,
            )
            assert done.stdout == b'{"status":"ok","result":{"readme":true,"commits":2}}\n', (
                done.stderr
            )
            env = subprocess.run(
                [*compose, "exec", "-T", "agent", "env"],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout
            assert "AWF_BOUNDED_QUERY_REPOS=octo/alpha" in env
            assert "TOKEN" not in env
            # The detached project has its workspace quota too (harness/lifecycle/quota.py).
            work = Path(state["privateRoot"]) / "work"
            assert any(
                line.split()[4] == str(work) and " - tmpfs " in line
                for line in Path("/proc/self/mountinfo").read_text().splitlines()
            )
            assert "degraded" not in err
        finally:
            assert main(["compose-down", "--out", str(out)]) == 0
        assert str(base) not in Path("/proc/self/mountinfo").read_text()
        assert leftover(engine, LABEL_HARNESS_RUN, state["runId"]) == []
        assert leftover(engine, LABEL_RUN, state["runId"]) == []
        assert list(base.iterdir()) == []


def test_demo_answers_every_kind_and_refuses_over_budget(engine, capfd):
    from bounded_query.harness.demo import demo

    status = demo({"PATH": os.environ["PATH"]})
    out = capfd.readouterr().out
    assert status == 0, out
    for kind in ("const", "boolean", "enum", "integer", "object", "tuple", "array", "union"):
        assert f"\n{kind:8} " in out
    # The skill's eight copyable examples (59 bits) and one more boolean all
    # answer, and so does the bounded-agent question.
    assert out.count('{"status":"ok"') == 10
    assert '-> {"status":"ok","result":{"tag":"major","value":2}}' in out
    assert "<- refused: 14 bits > 5 left" in out
    assert 'a boolean question -> {"status":"error"}' in out
    assert "| `example/widgets` | internal | 64 | 64 | 9 |" in out
    # The bounded-agent question: said plainly to go to the scripted stand-in
    # (no ANTHROPIC_API_KEY here), answered by the real engine in its enclave.
    assert "SCRIPTED stand-in model" in out
    assert "Is this library at a 2.x release or later?" in out
    assert (
        '\n                      -> {"status":"ok","result":true}'
        in out.split("bounded agents:")[1]
    )
    # The example agent ran confined, in its own container (issue 8).
    log = Path(tempfile.gettempdir()) / "bounded-query-demo-events.jsonl"
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    [mode] = [e for e in events if e.get("event") == "agent_mode"]
    assert mode["mode"] == "container"
    assert mode["user"] != "0:0"


@pytest.mark.parametrize("mode", ["gvisor", "compose"])
async def test_run_with_gvisor_or_compose_broker(engine, tmp_path, mode):
    from bounded_query.harness.compose.service import compose_broker_starter

    section = {**ALPHA, "runtime": "gvisor"} if mode == "gvisor" else ALPHA
    starter = compose_broker_starter(None) if mode == "compose" else None
    status, events, answers = await run_agent(tmp_path, section, commits=1, starter=starter)
    assert status == 0, events
    ok = '{"status":"ok","result":{"readme":true,"commits":1}}\n'
    assert answers == [ok] * 3
    run_id_events = [e for e in events if e["event"] == "preflight_passed"]
    assert run_id_events[0]["runtime"] == section.get("runtime", "docker")
    assert engine.containers.list(all=True, filters={"label": LABEL_HARNESS_RUN}) == []


def test_broker_image_without_the_query_image_tells_to_run_make_images(engine, tmp_path):
    from bounded_query.harness.compose.service import ComposeError, ensure_broker_image

    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    with pytest.raises(ComposeError, match="make images"):
        # The empty wheel directory proves the check comes before any download.
        ensure_broker_image(host, wheels=tmp_path, query_image="bounded-query-absent:never")


def test_broker_image_build_is_idempotent(engine):
    from bounded_query.harness.compose.service import (
        BROKER_IMAGE,
        RECIPE_LABEL,
        ensure_broker_image,
    )

    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    recipe = ensure_broker_image(host)
    first = engine.images.get(BROKER_IMAGE)
    dangling = {i.id for i in engine.images.list(filters={"dangling": True})}
    assert ensure_broker_image(host) == recipe
    again = engine.images.get(BROKER_IMAGE)
    assert again.id == first.id
    assert again.labels[RECIPE_LABEL] == recipe
    assert {i.id for i in engine.images.list(filters={"dangling": True})} <= dangling
