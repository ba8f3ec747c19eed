"""``run`` end to end with a real broker process (spec 14.2, 14.6-14.8).

The broker is the real daemon (``run_server``) with the shared subprocess
fake runner (``tests.fakes``), so these tests need no engine; the engine
end-to-end run lives in ``test_harness_engine.py``. Agent scripts read
``$QUERY_OUT``/``$QUERY_REPO`` when set (fake runner) and fall back to the
container paths, so the same agent works in both.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from bounded_query.broker.protocol.policy import LABEL_HARNESS_RUN
from bounded_query.harness import RunOptions, run
from bounded_query.harness.records.events import EventSink
from tests.harness.bq_harness_helpers import (
    FAKE_BROKER,
    HOST_AGENT,
    cmdlines,
    make_repo,
    var_tmp_base,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

AGENT = r"""
import json, os, subprocess, sys
report = {
    "socket": os.environ.get("AWF_BOUNDED_QUERY_SOCKET"),
    "skill": os.environ.get("AWF_BOUNDED_QUERY_SKILL"),
    "repos": os.environ.get("AWF_BOUNDED_QUERY_REPOS"),
    "tokens": [k for k in ("GH_TOKEN", "GITHUB_TOKEN") if k in os.environ],
    "path0": os.environ["PATH"].split(os.pathsep)[0],
    "skill_text": open(os.environ["AWF_BOUNDED_QUERY_SKILL"]).read()[:1200],
}
SCRIPT = (
    "import json, os\n"
    "repo = os.environ.get('QUERY_REPO', '/query/repo')\n"
    "out = os.environ.get('QUERY_OUT', '/query/out')\n"
    "json.dump(os.path.exists(os.path.join(repo, 'README.md')), open(out, 'w'))\n"
)
def ask(repo, schema):
    done = subprocess.run(["bounded-query", "--repo", repo, "--schema", json.dumps(schema)],
                          input=SCRIPT.encode(), capture_output=True, check=True)
    return done.stdout.decode()
report["alpha"] = ask("octo/alpha", {"type": "boolean"})
report["vault"] = ask("octo/vault", {"type": "boolean"})
json.dump(report, open(sys.argv[1], "w"))
sys.exit(int(sys.argv[2]))
"""


def write_config(path: Path, enabled: bool = True, timeout: int = 30) -> Path:
    path.write_text(
        json.dumps(
            {
                "boundedQueries": {
                    "enabled": enabled,
                    "privateRepos": [
                        {"repo": "octo/alpha", "sensitivity": "internal"},
                        {"repo": "octo/vault", "sensitivity": "sealed"},
                    ],
                    "timeout": timeout,
                }
            }
        )
    )
    return path


@pytest.fixture
def setup(tmp_path, fake_engine):
    with var_tmp_base() as base:
        source = tmp_path / "src"
        make_repo(source, {"README.md": "hi\n"})
        workspace = tmp_path / "ws"
        workspace.mkdir()
        agent = tmp_path / "agent.py"
        agent.write_text(AGENT)
        summary = tmp_path / "summary.md"
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(REPO_ROOT),
            "GH_TOKEN": "should-not-reach-the-agent",
            "GITHUB_STEP_SUMMARY": str(summary),
            # A fake Engine API: these runs need no engine (preflight, sweep, teardown).
            "DOCKER_HOST": fake_engine.docker_host,
        }
        yield {
            "tmp": tmp_path,
            "base": base,
            "source": source,
            "workspace": workspace,
            "agent": agent,
            "summary": summary,
            "env": env,
            "engine": fake_engine,
        }


def options(setup, config: Path, agent: tuple[str, ...], **extra) -> RunOptions:
    return RunOptions(
        config_source=str(config),
        agent=agent,
        seed_sources={"octo/alpha": setup["source"], "octo/vault": setup["source"]},
        workspace=setup["workspace"],
        base=setup["base"],
        broker_command=FAKE_BROKER,
        probe_runtime=False,
        **{**HOST_AGENT, **extra},
    )


def events_of(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def run_and_signal(
    opts: RunOptions, env: dict, ready: Callable[[str], bool], signum: int
) -> tuple[int, str]:
    """Run the harness in this process; send ``signum`` once ``ready(events so far)``."""
    stream = io.StringIO()
    result: list[int] = []

    async def harness() -> None:
        result.append(await run(opts, EventSink(stream), env))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(harness)
        for _ in range(600):
            if ready(stream.getvalue()):
                break
            await trio.sleep(0.05)
        os.kill(os.getpid(), signum)
    [status] = result
    return status, stream.getvalue()


def with_options(opts: RunOptions, **changes: object) -> RunOptions:
    return dataclasses.replace(opts, **changes)  # type: ignore[arg-type]


async def test_full_run_passes_agent_status_and_tears_down(setup):
    config = write_config(setup["tmp"] / "c.json")
    report_path = setup["tmp"] / "report.json"
    stream = io.StringIO()
    status = await run(
        options(setup, config, (sys.executable, str(setup["agent"]), str(report_path), "7")),
        EventSink(stream),
        setup["env"],
    )
    events = events_of(stream)
    assert status == 7, events
    report = json.loads(report_path.read_text())
    assert report["alpha"] == '{"status":"ok","result":true}\n'
    assert report["vault"] == '{"status":"error"}\n'
    assert report["repos"] == "octo/alpha,octo/vault"
    assert report["tokens"] == []
    assert report["path0"].endswith("/skill/bin")
    assert report["socket"].endswith("/run/broker.sock")
    assert "awf-bounded-query-ingress-" in report["socket"]
    assert "`octo/alpha` — 64 bits/run (`internal`)" in report["skill_text"]
    names = [e["event"] for e in events]
    for expected in (
        "preflight_passed",
        "repo_staged",
        "broker_ready",
        "agent_started",
        "agent_exited",
        "broker_stopped",
        "roots_removed",
        "run_end",
    ):
        assert expected in names, expected
    assert events[-1]["status"] == 7
    usage = {e["repo"]: e for e in events if e["event"] == "repo_usage"}
    assert usage["octo/alpha"]["spent"] == 5
    assert usage["octo/alpha"]["invocations"] == 1
    assert usage["octo/vault"]["spent"] == 0
    assert list(setup["base"].iterdir()) == []
    summary = setup["summary"].read_text()
    assert "| `octo/alpha` | internal | 64 | 5 | 1 |" in summary
    assert "| `octo/vault` | sealed | 0 | 0 | 0 |" in summary
    assert "Refused before launch (any repository): 1" in summary
    assert "should-not-reach-the-agent" not in stream.getvalue()
    # The engine work around the run went to DOCKER_HOST (the fake Engine API):
    # the sweep of stale agent containers, then teardown's reconcile by run label.
    engine = setup["engine"]
    assert "containers_reconciled" in names
    assert not [e for e in events if e["event"] == "degraded" and e["subsystem"] == "harness"]
    listed = engine.listed_labels("containers")
    assert listed[0] == ["bounded-query.role=agent"]
    # Teardown's one reconcile: a compose broker service of the run first
    # (its own label), then the run's containers, then its volumes.
    [service_label], [run_label] = listed[1], listed[2]
    assert service_label == f"{LABEL_HARNESS_RUN}={run_label.partition('=')[2]}"
    assert run_label.startswith("bounded-query.run=")
    assert engine.listed_labels("volumes") == [[run_label]]
    assert engine.unexpected == []


async def test_disabled_runs_the_agent_untouched(setup):
    config = write_config(setup["tmp"] / "c.yaml", enabled=False)
    out = setup["tmp"] / "env.json"
    code = f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"
    stream = io.StringIO()
    status = await run(
        options(setup, config, (sys.executable, "-c", code)), EventSink(stream), setup["env"]
    )
    assert status == 0
    seen = json.loads(out.read_text())
    assert seen["GH_TOKEN"] == "should-not-reach-the-agent"
    assert not [k for k in seen if k.startswith("AWF_BOUNDED_QUERY")]
    assert seen["PATH"] == setup["env"]["PATH"]
    assert list(setup["base"].iterdir()) == []
    assert not setup["summary"].exists()  # byte-identical to a run without the section
    assert "bounded_queries_disabled" in [e["event"] for e in events_of(stream)]


async def test_invalid_config_exits_2_without_running_the_agent(setup):
    config = setup["tmp"] / "bad.json"
    config.write_text('{"boundedQueries": {"enabled": true, "timeout": 999}}')
    marker = setup["tmp"] / "ran"
    stream = io.StringIO()
    status = await run(
        options(setup, config, ("touch", str(marker))), EventSink(stream), setup["env"]
    )
    assert status == 2
    assert not marker.exists()
    events = events_of(stream)
    assert events[0]["location"] == "boundedQueries.timeout"
    assert "540" in events[0]["hint"]
    assert [e["event"] for e in events[-2:]] == ["config_invalid", "run_end"]
    assert list(setup["base"].iterdir()) == []
    summary = setup["summary"].read_text()
    assert "invalid configuration (exit 2)" in summary
    assert "`boundedQueries.timeout`" in summary
    assert "fix: use a whole number of seconds from 1 to 540" in summary


async def test_failed_preflight_exits_2_before_staging(setup):
    config = write_config(setup["tmp"] / "c.json")
    marker = setup["tmp"] / "ran"
    env = {**setup["env"], "DOCKER_HOST": "tcp://127.0.0.1:2375"}
    stream = io.StringIO()
    status = await run(options(setup, config, ("touch", str(marker))), EventSink(stream), env)
    assert status == 2
    assert not marker.exists()
    assert list(setup["base"].iterdir()) == []
    events = events_of(stream)
    assert [e["location"] for e in events if e["event"] == "preflight_error"] == ["DOCKER_HOST"]
    assert "failed before the agent started" in setup["summary"].read_text()


async def test_broker_that_never_gets_ready_exits_2_and_cleans_up(setup):
    config = write_config(setup["tmp"] / "c.json")
    marker = setup["tmp"] / "ran"
    stream = io.StringIO()
    opts = with_options(options(setup, config, ("touch", str(marker))), broker_command=("false",))
    status = await run(opts, EventSink(stream), setup["env"])
    assert status == 2
    assert not marker.exists()
    assert list(setup["base"].iterdir()) == []
    assert "broker_failed" in [e["event"] for e in events_of(stream)]


async def test_signal_is_forwarded_to_the_agent_and_everything_is_torn_down(setup):
    config = write_config(setup["tmp"] / "c.json")
    marker = setup["tmp"] / "started"
    code = textwrap.dedent(
        f"""
        import pathlib, time
        pathlib.Path({str(marker)!r}).write_text("x")
        time.sleep(60)
        """
    )
    status, text = await run_and_signal(
        options(setup, config, (sys.executable, "-c", code)),
        setup["env"],
        lambda _events: marker.exists(),
        signal.SIGTERM,
    )
    assert status == 128 + signal.SIGTERM
    assert list(setup["base"].iterdir()) == []
    names = [json.loads(line)["event"] for line in text.splitlines()]
    assert "signal" in names
    assert names[-1] == "run_end"


async def test_private_root_under_the_agents_home_fails_preflight(setup):
    config = write_config(setup["tmp"] / "c.json")
    env = {**setup["env"], "HOME": str(setup["base"])}
    stream = io.StringIO()
    status = await run(options(setup, config, ("true",)), EventSink(stream), env)
    assert status == 2
    errors = [e for e in events_of(stream) if e["event"] == "preflight_error"]
    assert [e["location"] for e in errors] == ["private root"]
    assert list(setup["base"].iterdir()) == []


async def test_signal_before_the_agent_tears_down_and_exits_128_plus_n(setup):
    config = write_config(setup["tmp"] / "c.json")
    marker = setup["tmp"] / "ran"
    # A "broker" that never gets ready: the harness waits for it.
    opts = with_options(
        options(setup, config, ("touch", str(marker))),
        broker_command=(sys.executable, "-c", "import time; time.sleep(60)"),
        ready_timeout=60.0,
    )
    status, text = await run_and_signal(
        opts, setup["env"], lambda events: '"broker_started"' in events, signal.SIGINT
    )
    assert status == 128 + signal.SIGINT
    assert not marker.exists()
    assert list(setup["base"].iterdir()) == []
    events = [json.loads(line) for line in text.splitlines()]
    names = [e["event"] for e in events]
    assert names.index("broker_stopped") < names.index("roots_removed") < names.index("run_end")
    assert "agent_started" not in names
    assert events[-1]["status"] == 130


IGNORES_SIGTERM = """
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(sys.argv[1]).write_text("x")
time.sleep(60)
"""


async def test_an_agent_ignoring_the_signal_is_stopped_after_the_grace(setup):
    config = write_config(setup["tmp"] / "c.json")
    marker = setup["tmp"] / "started"
    opts = with_options(
        options(setup, config, (sys.executable, "-c", IGNORES_SIGTERM, str(marker))),
        stop_grace=0.5,
    )
    status, text = await run_and_signal(
        opts, setup["env"], lambda _events: marker.exists(), signal.SIGTERM
    )
    assert status == 128 + signal.SIGTERM
    assert list(setup["base"].iterdir()) == []
    events = [json.loads(line) for line in text.splitlines()]
    stopped = next(e for e in events if e["event"] == "agent_stopped")
    assert stopped["status"] == 128 + signal.SIGKILL  # ignored SIGTERM twice
    names = [e["event"] for e in events]
    assert names.index("agent_stopped") < names.index("broker_stopped") < names.index("run_end")


HARNESS_PROCESS = """
import sys, trio
from pathlib import Path
from bounded_query.harness.records.events import EventSink
from bounded_query.harness import RunOptions, run
config, source, workspace, base, marker = sys.argv[1:6]
options = RunOptions(
    config_source=config,
    agent=(sys.executable, "-c", "import pathlib, sys, time; "
           "pathlib.Path(sys.argv[1]).write_text('x'); time.sleep(60)", marker),
    seed_sources={"octo/alpha": Path(source), "octo/vault": Path(source)},
    workspace=Path(workspace),
    base=Path(base),
    broker_command=(sys.executable, "-m", "tests.fakes.broker_main"),
    probe_runtime=False,
    agent_on_host=True,
    unconfined_agent=True,
)
sys.exit(trio.run(run, options, EventSink()))
"""


def brokers_of(roots: list[bytes]) -> list[bytes]:
    """Command lines of fake brokers serving one of ``roots``."""
    return [c for c in cmdlines() if b"broker_main" in c and any(r in c for r in roots)]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_harness_process_killed_by_a_real_signal_leaves_nothing(setup, signum):
    """The harness as its own process: the broker child and both roots go too."""
    import subprocess
    import time

    config = write_config(setup["tmp"] / "c.json")
    marker = setup["tmp"] / "started"
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HARNESS_PROCESS,
            str(config),
            str(setup["source"]),
            str(setup["workspace"]),
            str(setup["base"]),
            str(marker),
        ],
        env=setup["env"],
        cwd=REPO_ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.stderr is not None
        assert marker.exists(), process.stderr.read() if process.poll() is not None else ""
        roots = [str(p).encode() for p in setup["base"].iterdir()]
        assert brokers_of(roots), "the broker child should be running"
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signum, err
    events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert events[-1]["event"] == "run_end"
    assert events[-1]["status"] == 128 + signum
    assert list(setup["base"].iterdir()) == []
    assert brokers_of(roots) == []


async def test_progress_prints_one_human_line_per_answer(setup, capsys):
    config = write_config(setup["tmp"] / "c.json")
    report_path = setup["tmp"] / "report.json"
    stream = io.StringIO()
    opts = options(setup, config, (sys.executable, str(setup["agent"]), str(report_path), "0"))
    status = await run(with_options(opts, progress=True), EventSink(stream), setup["env"])
    assert status == 0, events_of(stream)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("bounded-query:")]
    assert lines[0].startswith("bounded-query: octo/alpha  boolean  5 bits  ")
    assert lines[0].endswith("  ok")
    assert lines[1].startswith("bounded-query: octo/vault  boolean  —  ")
    assert lines[1].endswith("  bit-budget-exhausted")
    assert len(lines) == 2
    quiet = io.StringIO()
    opts = with_options(opts, agent=(sys.executable, str(setup["agent"]), str(report_path), "0"))
    assert await run(with_options(opts, progress=False), EventSink(quiet), setup["env"]) == 0
    assert "bounded-query:" not in capsys.readouterr().err


RECORDS_AGENT = r"""
import json, subprocess, sys
def ask(script):
    done = subprocess.run(
        ["bounded-query", "--repo", "octo/alpha", "--schema", '{"type":"boolean"}'],
        input=script.encode(), capture_output=True, check=True)
    return done.stdout.decode()
out = "import json, os\nout = os.environ.get('QUERY_OUT', '/query/out')\n"
first = ask(out + "json.dump(True, open(out, 'w'))  # DISTINCT-SCRIPT-7f3a\n")
second = ask(out + "json.dump('DISTINCT-OUTPUT-9c1e', open(out, 'w'))\n")
sys.exit(0 if (first, second) == ('{"status":"ok","result":true}\n', '{"status":"error"}\n') else 3)
"""


async def test_no_record_holds_a_script_an_output_a_host_path_or_a_token(setup):
    """Issue 14 item 1: scan every record of a run that used distinctive strings."""
    import jsonschema

    from bounded_query.harness.records.events import schema_path
    from bounded_query.harness.records.report import load_state, report_document

    agent = setup["tmp"] / "records_agent.py"
    agent.write_text(RECORDS_AGENT)
    config = write_config(setup["tmp"] / "c.json")
    kept = setup["tmp"] / "kept"
    env = {**setup["env"], "GH_TOKEN": "DISTINCT-TOKEN-51b2", "GITHUB_TOKEN": "DISTINCT-TOKEN-51b2"}
    stream = io.StringIO()
    opts = with_options(options(setup, config, (sys.executable, str(agent))), keep_state=kept)
    status = await run(opts, EventSink(stream), env)
    assert status == 0, events_of(stream)
    audit = (kept / "audit" / "audit.jsonl").read_bytes()
    journal = (kept / "state" / "journal").read_bytes()
    report = json.dumps(report_document(load_state(kept)))
    records = {
        "events": stream.getvalue().encode(),
        "step summary": setup["summary"].read_bytes(),
        "audit": audit,
        "journal": journal,
        "report": report.encode(),
    }
    secrets = {
        "script": b"DISTINCT-SCRIPT-7f3a",
        "output": b"DISTINCT-OUTPUT-9c1e",
        "token": b"DISTINCT-TOKEN-51b2",
        "host path": str(setup["base"]).encode(),
    }
    for where, data in records.items():
        for what, needle in secrets.items():
            assert needle not in data, f"the {where} holds the {what}"
    lines = [json.loads(line) for line in audit.splitlines()]
    assert [(r["repo"], r["category"]) for r in lines] == [
        ("octo/alpha", "ok"),
        ("octo/alpha", "invalid-output"),
    ]
    written = events_of(stream)
    for record_type, docs in (
        ("bounded-query-audit/v1", lines),
        (
            "bounded-query-event/v1",
            [e for e in written if e["_schema"] == "bounded-query-event/v1"],
        ),
        (
            "bounded-query-broker/v1",
            [e for e in written if e["_schema"] == "bounded-query-broker/v1"],
        ),
        ("bounded-query-report/v1", [json.loads(report)]),
    ):
        assert docs, record_type
        schema = json.loads(schema_path(record_type).read_text(encoding="utf-8"))
        for doc in docs:
            jsonschema.validate(doc, schema)
    kept_event = [e for e in events_of(stream) if e["event"] == "state_kept"]
    assert kept_event[0]["files"] == [
        "seed-map.json",
        "broker.json",
        "state/journal",
        "audit/audit.jsonl",
    ]
