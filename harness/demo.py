"""``bounded-query-harness demo``: the built-in example end to end.

Builds a small git repository from ``example/repo`` (three commits with fixed
dates), stages it with ``--seed-source`` as the internal repository
``example/widgets`` and as the sealed ``example/vault``, runs the example
agent (``example/agent.py``: one question per schema kind, the ledger
draining, a refused over-budget question, a refused sealed question) under
``run`` with the real broker, confined like any agent: in its own container
(the built-in agent image, ``.ci/build-images``) with the demo workspace,
the socket directory and the skill/wrapper directory as its only mounts,
and prints the step summary. JSONL events go to
a log file whose path is printed, so the terminal shows the agent's output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import trio

from bounded_query.harness.lifecycle.options import RunOptions
from bounded_query.harness.lifecycle.orchestrate import run
from bounded_query.harness.records.events import EventSink

__all__ = ["EXAMPLE_DIR", "build_example_repo", "demo"]

EXAMPLE_DIR = Path(__file__).resolve().parent / "example"
_COMMITS = (
    ("Initial widgets library", ("README.md", "pyproject.toml", "LICENSE", "src")),
    ("Add tests", ("tests",)),
    ("Release 2.3.1", ("VERSION",)),
)


def build_example_repo(target: Path) -> str:
    """Create the example repository at ``target``; return its HEAD commit."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(target.parent),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "Demo",
        "GIT_AUTHOR_EMAIL": "demo@example.invalid",
        "GIT_COMMITTER_NAME": "Demo",
        "GIT_COMMITTER_EMAIL": "demo@example.invalid",
    }

    def git(*args: str, date: str = "") -> str:
        extra = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date} if date else {}
        return subprocess.run(
            ["git", *args],
            cwd=target,
            env={**env, **extra},
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    target.mkdir(parents=True)
    git("init", "-q", "-b", "main")
    for index, (message, names) in enumerate(_COMMITS):
        for name in names:
            source = EXAMPLE_DIR / "repo" / name
            if source.is_dir():
                shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copyfile(source, target / name)
        git("add", "-A")
        git("commit", "-q", "-m", message, date=f"2026-01-0{index + 1}T12:00:00Z")
    return git("rev-parse", "HEAD").strip()


def demo(env: dict[str, str] | None = None) -> int:
    """Run the demo; returns the run's exit status."""
    env = dict(os.environ if env is None else env)
    work = Path(tempfile.mkdtemp(prefix="bounded-query-demo-"))
    try:
        source = work / "widgets"
        build_example_repo(source)
        config = EXAMPLE_DIR / "awf-config.yaml"
        workspace = work / "workspace"
        workspace.mkdir()
        # The agent sees only its workspace: the example agent goes there.
        shutil.copyfile(EXAMPLE_DIR / "agent.py", workspace / "agent.py")
        os.chmod(workspace / "agent.py", 0o444)
        summary = work / "summary.md"
        log = Path(tempfile.gettempdir()) / "bounded-query-demo-events.jsonl"
        options = RunOptions(
            config_source=str(config),
            agent=("python3", str(workspace / "agent.py")),
            seed_sources={"example/widgets": source, "example/vault": source},
            workspace=workspace,
            broker_log=log,
        )
        print(
            f"demo: staging {source} as example/widgets (internal) and example/vault"
            f" (sealed); JSONL events -> {log}\n",
            flush=True,
        )
        log.write_text("")
        with log.open("a", encoding="utf-8") as stream:
            sink = EventSink(stream)
            status = trio.run(run, options, sink, {**env, "GITHUB_STEP_SUMMARY": str(summary)})
        if summary.exists():
            text = summary.read_text()
            print("\n" + text)
            if env.get("GITHUB_STEP_SUMMARY"):
                with open(env["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as handle:
                    handle.write(text)
        failures = [e for e in sink.events if e["event"].endswith(("_error", "_failed"))]
        for event in failures:
            print(json.dumps(event), file=sys.stderr)
        print(f"demo: exit status {status}")
        return status
    finally:
        shutil.rmtree(work, ignore_errors=True)
