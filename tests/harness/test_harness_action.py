"""The composite GitHub Action (issue 14 item 4): linted, and its steps run here.

``action.yml`` and the example workflow are validated with check-jsonschema's
vendored SchemaStore schemas for GitHub actions and workflows (no network).
The action's step script (``.github/action/bq-action.sh``) is run locally:
with a recording stand-in for the harness to pin down the command line it
builds from the inputs, and for real (engine test) on the built-in example,
where the agent asks one bounded question and the step summary is written.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.conftest import require_engine

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "action.yml"
WORKFLOW = ROOT / ".github" / "workflows" / "example.yml"
SCRIPT = ROOT / ".github" / "action" / "bq-action.sh"
EXAMPLE_CONFIG = ROOT / "harness" / "example" / "awf-config.yaml"


def _check(schema: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_action_and_example_workflow_pass_the_github_schemas():
    for schema, path in (
        ("vendor.github-actions", ACTION),
        ("vendor.github-workflows", WORKFLOW),
    ):
        result = _check(schema, path)
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_linter_rejects_a_broken_action(tmp_path):
    doc = yaml.safe_load(ACTION.read_text(encoding="utf-8"))
    doc["runs"] = {"using": "composite", "steps": [{"run": "true"}]}  # no shell
    broken = tmp_path / "action.yml"
    broken.write_text(yaml.safe_dump(doc), encoding="utf-8")
    assert _check("vendor.github-actions", broken).returncode != 0


def test_every_input_is_wired_to_the_script_and_back():
    doc = yaml.safe_load(ACTION.read_text(encoding="utf-8"))
    inputs = set(doc["inputs"])
    steps = doc["runs"]["steps"]
    env = {k: v for step in steps for k, v in step.get("env", {}).items()}
    used = set(re.findall(r"\$\{\{ inputs\.([a-z-]+) \}\}", ACTION.read_text(encoding="utf-8")))
    assert used == inputs, "every input is used by a step, and only declared inputs are"
    script_vars = set(re.findall(r"INPUT_[A-Z_]+", SCRIPT.read_text(encoding="utf-8")))
    assert script_vars == {k for k in env if k.startswith("INPUT_")}
    assert doc["outputs"]["exit-code"]["value"] == "${{ steps.run.outputs.exit-code }}"
    assert any(step.get("id") == "run" for step in steps)


RECORDER = textwrap.dedent(
    """\
    import json, os, sys
    args = sys.argv[1:]
    record = {"argv": args}
    if "--config" in args:
        with open(args[args.index("--config") + 1], encoding="utf-8") as handle:
            record["config"] = handle.read()
    with open(os.environ["RECORD"], "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    sys.exit(int(os.environ.get("RECORDED_STATUS", "0")))
    """
)


def _run_step(
    tmp_path: Path, extra_env: dict[str, str] | None = None, **inputs: str
) -> tuple[subprocess.CompletedProcess[str], dict, str]:
    recorder = tmp_path / "recorder.py"
    recorder.write_text(RECORDER, encoding="utf-8")
    record = tmp_path / "record.json"
    output = tmp_path / "github-output"
    env = {
        "PATH": os.environ["PATH"],
        "BQ_HARNESS": f"{sys.executable} {recorder}",
        "RECORD": str(record),
        "GITHUB_OUTPUT": str(output),
        **{f"INPUT_{k.upper()}": v for k, v in inputs.items()},
    }
    env.update(extra_env or {})
    result = subprocess.run(
        ["bash", str(SCRIPT), "run"], env=env, capture_output=True, text=True, check=False
    )
    recorded = json.loads(record.read_text(encoding="utf-8")) if record.exists() else {}
    written = output.read_text(encoding="utf-8") if output.exists() else ""
    return result, recorded, written


def test_run_step_builds_the_harness_command_line(tmp_path):
    result, recorded, written = _run_step(
        tmp_path,
        config=str(EXAMPLE_CONFIG),
        agent_command='bounded-query-cost \'{"type":"boolean"}\'',
        seed_sources="example/widgets=/src/w\n\nexample/vault=/src/v\n",
        extra_args="--agent-network\nnone\n",
        workspace=str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert recorded["argv"] == [
        "run",
        "--config",
        str(EXAMPLE_CONFIG),
        "--workspace",
        str(tmp_path),
        "--seed-source",
        "example/widgets=/src/w",
        "--seed-source",
        "example/vault=/src/v",
        "--agent-network",
        "none",
        "--",
        "bash",
        "-c",
        'bounded-query-cost \'{"type":"boolean"}\'',
    ]
    assert written == "exit-code=0\n"


def test_runtime_override_rewrites_only_the_runtime(tmp_path):
    result, recorded, _ = _run_step(
        tmp_path, config=str(EXAMPLE_CONFIG), agent_command="true", runtime="gvisor"
    )
    assert result.returncode == 0, result.stderr
    config_arg = recorded["argv"][recorded["argv"].index("--config") + 1]
    assert config_arg != str(EXAMPLE_CONFIG)
    assert not Path(config_arg).exists(), "the rewritten configuration is removed afterwards"
    original = yaml.safe_load(EXAMPLE_CONFIG.read_text(encoding="utf-8"))
    original["boundedQueries"]["runtime"] = "gvisor"
    assert json.loads(recorded["config"]) == original


def test_the_agent_status_becomes_the_step_status_and_output(tmp_path):
    result, _, written = _run_step(
        tmp_path, {"RECORDED_STATUS": "7"}, config=str(EXAMPLE_CONFIG), agent_command="exit 7"
    )
    assert result.returncode == 7
    assert written == "exit-code=7\n"


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"agent_command": "true"}, "input config: is required"),
        ({"config": "/nonexistent/awf.yaml", "agent_command": "true"}, "no such file"),
        ({"config": str(EXAMPLE_CONFIG)}, "input agent-command: is required"),
        (
            {"config": str(EXAMPLE_CONFIG), "agent_command": "true", "runtime": "sbx"},
            "input runtime: must be docker or gvisor",
        ),
    ],
)
def test_bad_inputs_are_the_callers_fault(tmp_path, inputs, message):
    result, recorded, written = _run_step(tmp_path, **inputs)
    assert result.returncode == 2
    assert message in result.stderr
    assert recorded == {}, "the harness never started"
    assert written == ""


def test_runtime_override_of_a_file_without_the_section_is_refused(tmp_path):
    config = tmp_path / "other.yaml"
    config.write_text("somethingElse: {}\n", encoding="utf-8")
    result, recorded, _ = _run_step(
        tmp_path, config=str(config), agent_command="true", runtime="docker"
    )
    assert result.returncode == 2
    assert "input runtime: cannot apply it" in result.stderr
    assert recorded == {}


FAKE_SUDO = textwrap.dedent(
    """\
    #!PYTHON
    # Stands in for sudo: records how it was called, then keeps only the
    # variables named in --preserve-env (as sudo does) and runs the command.
    import json, os, sys
    args = sys.argv[1:]
    with open(os.environ["SUDO_RECORD"], "w", encoding="utf-8") as handle:
        json.dump({"argv": args, "uid": os.getuid()}, handle)
    keep = set()
    while args[0] != "--":
        if args[0].startswith("--preserve-env="):
            keep = set(args[0].split("=", 1)[1].split(","))
        args.pop(0)
    env = {k: v for k, v in os.environ.items() if k in keep}
    os.execvpe(args[1], args[1:], env)
    """
)


@pytest.fixture
def nobody_dir():
    """A directory uid 65534 can reach (pytest's own tmp_path sits under a 0700 one)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="bq-action-test-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


#: The system interpreter: the test venv's sits under /root, which uid 65534 cannot enter.
SYSTEM_PYTHON = "/usr/bin/python3"


def test_a_non_root_runner_starts_the_harness_as_root_keeping_its_variables(nobody_dir):
    """As the runner's user (uid 65534 here), the step goes through sudo, by name only."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become uid 65534")
    bin_dir = nobody_dir / "bin"
    bin_dir.mkdir()
    bin_dir.chmod(0o755)
    sudo = bin_dir / "sudo"
    sudo.write_text(FAKE_SUDO.replace("PYTHON", SYSTEM_PYTHON), encoding="utf-8")
    sudo.chmod(0o755)
    recorder = nobody_dir / "recorder.py"
    recorder.write_text(
        RECORDER.replace(
            'record = {"argv": args}',
            'record = {"argv": args, "env": dict(os.environ)}',
        ),
        encoding="utf-8",
    )
    recorder.chmod(0o644)
    shared = nobody_dir
    record, sudo_record = shared / "record.json", shared / "sudo.json"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "BQ_HARNESS": f"{SYSTEM_PYTHON} {recorder}",
        "RECORD": str(record),
        "SUDO_RECORD": str(sudo_record),
        "INPUT_CONFIG": str(EXAMPLE_CONFIG),
        "INPUT_AGENT_COMMAND": "true",
        "INPUT_WORKSPACE": str(shared),
        "GH_TOKEN": "s3cr3t-staging-token",
        "GITHUB_STEP_SUMMARY": str(shared / "summary.md"),
        "GITHUB_SERVER_URL": "https://github.example",
        "ANTHROPIC_API_KEY": "the-agent's-own",
        "LD_LIBRARY_PATH": "/nonexistent/lib",
    }
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", str(SCRIPT), "run"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    called = json.loads(sudo_record.read_text(encoding="utf-8"))
    assert called["uid"] == 65534
    assert "s3cr3t-staging-token" not in json.dumps(called["argv"]), "no token on argv"
    assert "the-agent's-own" not in json.dumps(called["argv"])
    harness = json.loads(record.read_text(encoding="utf-8"))
    kept = harness["env"]
    assert kept["GH_TOKEN"] == "s3cr3t-staging-token"
    assert kept["GITHUB_STEP_SUMMARY"] == str(shared / "summary.md")
    assert kept["GITHUB_SERVER_URL"] == "https://github.example"
    assert kept["ANTHROPIC_API_KEY"] == "the-agent's-own"
    assert "LD_LIBRARY_PATH" not in kept
    assert kept["PATH"] == env["PATH"]
    assert harness["argv"][:2] == ["run", "--config"]


def test_a_root_runner_needs_no_sudo(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the tests run as root in CI")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text("#!/bin/sh\nexit 99\n", encoding="utf-8")
    (bin_dir / "sudo").chmod(0o755)
    result, recorded, _ = _run_step(
        tmp_path,
        {"PATH": f"{bin_dir}:{os.environ['PATH']}"},
        config=str(EXAMPLE_CONFIG),
        agent_command="true",
    )
    assert result.returncode == 0, result.stderr
    assert recorded["argv"][0] == "run"


ASK = (
    "bounded-query --repo example/widgets --schema '{\"type\":\"boolean\"}' <<'EOF'\n"
    "import json, os\n"
    "json.dump(os.path.exists('/query/repo/README.md'), open('/query/out', 'w'))\n"
    "EOF\n"
)


@pytest.mark.engine
def test_the_action_runs_the_example_for_real(tmp_path):
    require_engine()
    from bounded_query.harness.demo import build_example_repo

    source = tmp_path / "widgets"
    build_example_repo(source)
    workspace = tmp_path / "workspace"
    workspace.mkdir(mode=0o777)
    workspace.chmod(0o777)
    summary = tmp_path / "summary.md"
    output = tmp_path / "github-output"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("GH_TOKEN", "GITHUB_TOKEN")},
        "INPUT_CONFIG": str(EXAMPLE_CONFIG),
        "INPUT_AGENT_COMMAND": ASK + "test \"$(cat /dev/null)\" = ''",
        "INPUT_SEED_SOURCES": f"example/widgets={source}\nexample/vault={source}",
        "INPUT_RUNTIME": "docker",
        "INPUT_WORKSPACE": str(workspace),
        "GITHUB_STEP_SUMMARY": str(summary),
        "GITHUB_OUTPUT": str(output),
    }
    result = subprocess.run(
        ["bash", str(SCRIPT), "run"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert '{"status":"ok","result":true}' in result.stdout
    assert output.read_text(encoding="utf-8") == "exit-code=0\n"
    text = summary.read_text(encoding="utf-8")
    assert "example/widgets" in text


@pytest.mark.engine
@pytest.mark.slow
def test_the_install_step_on_a_prepared_debian_host_changes_nothing_it_need_not(tmp_path):
    """The install step, run for real into a fresh venv on this (Debian) machine.

    The packages are there and runsc is registered, so it must install the
    project, leave ``/etc/docker/daemon.json`` byte-identical, not restart
    dockerd, and leave the images up to date.
    """
    require_engine()
    import venv

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    daemon_json = Path("/etc/docker/daemon.json")
    before = daemon_json.read_bytes() if daemon_json.exists() else None
    dockerd = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True)
    env = {
        **os.environ,
        "PATH": f"{env_dir / 'bin'}:{os.environ['PATH']}",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        ["bash", str(SCRIPT), "install"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (env_dir / "bin" / "bounded-query-harness").exists()
    after = daemon_json.read_bytes() if daemon_json.exists() else None
    assert after == before
    assert subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout == (
        dockerd.stdout
    )
    assert "up to date" in result.stderr
