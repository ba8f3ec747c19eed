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

The agent also asks one bounded-agent question (spec 15) about the same
repository: real Claude Code in a single-use enclave, reaching its model only
through the run's API proxy. With ``ANTHROPIC_API_KEY`` set, the model is the
real provider's; without it, the demo says so and starts a scripted stand-in
model (``scripted_provider.py``) that answers only once the engine has
really read the repository's ``VERSION`` file through its own tool.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import trio
import yaml

from bounded_query.harness.configuration.preflight import docker_host_from_env
from bounded_query.harness.lifecycle.options import RunOptions
from bounded_query.harness.lifecycle.orchestrate import run
from bounded_query.harness.records.events import EventSink
from bounded_query.harness.scripted_provider import ProviderScript, scripted_provider

__all__ = ["EXAMPLE_DIR", "build_example_repo", "demo"]

EXAMPLE_DIR = Path(__file__).resolve().parent / "example"
#: The demo's bounded-agent engine and model (claude: the enclave built by
#: ``make images``; the model name is what the real provider is asked for).
DEMO_ENGINE = "claude"
DEMO_MODEL = "claude-haiku-4-5"
#: The stand-in's script: the engine's first turn reads VERSION with its
#: shell tool; the answer ("is it a 2.x release?") comes only once the
#: file's contents came back to the model.
STAND_IN = ProviderScript(command="cat VERSION", marker="2.3.1", answer="true")
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


def _agents_section(target: str | None) -> dict[str, object]:
    section: dict[str, object] = {
        "boundedAgents": {
            "enabled": True,
            "privateRepos": [{"repo": "example/widgets", "sensitivity": "internal"}],
            "runtime": "docker",
            "engine": DEMO_ENGINE,
            "model": DEMO_MODEL,
            "timeout": 120,
        }
    }
    if target is not None:
        section["apiProxy"] = {"targets": {"anthropic": {"host": target}}}
    return section


@contextlib.contextmanager
def _model(env: dict[str, str]) -> Iterator[tuple[dict[str, object], str | None]]:
    """The bounded-agent part of the demo's configuration and run options.

    The real provider when ``ANTHROPIC_API_KEY`` is set; otherwise the
    scripted stand-in, with a credential made up for this demo (which the
    stand-in alone accepts, so the answer also shows the proxy injecting it).
    Yields the configuration's part and the stand-in's network (None: the
    real provider), which the API proxy's egress side joins.
    """
    if env.get("ANTHROPIC_API_KEY", "").strip():
        print(
            "demo: bounded agents ask the real provider (ANTHROPIC_API_KEY is set;"
            f" model {DEMO_MODEL}); the repository's content is sent to it (spec 15.9)\n",
            flush=True,
        )
        yield _agents_section(None), None
        return
    credential = "demo-" + secrets.token_hex(16)
    script = dataclasses.replace(STAND_IN, credential=credential)
    with scripted_provider(docker_host_from_env(env), script) as provider:
        print(
            "demo: no ANTHROPIC_API_KEY, so the bounded-agent question goes to a SCRIPTED"
            " stand-in model built into the demo (harness/example/anthropic_provider.py),"
            " not to a real provider; Claude Code itself runs for real in its enclave and"
            " the stand-in answers only after the engine read VERSION through its tool\n",
            flush=True,
        )
        env["ANTHROPIC_API_KEY"] = credential
        yield _agents_section(provider.target), provider.network


def demo(env: dict[str, str] | None = None) -> int:
    """Run the demo; returns the run's exit status."""
    env = dict(os.environ if env is None else env)
    work = Path(tempfile.mkdtemp(prefix="bounded-query-demo-"))
    try:
        source = work / "widgets"
        build_example_repo(source)
        workspace = work / "workspace"
        workspace.mkdir()
        # The agent sees only its workspace: the example agent goes there.
        shutil.copyfile(EXAMPLE_DIR / "agent.py", workspace / "agent.py")
        os.chmod(workspace / "agent.py", 0o444)
        summary = work / "summary.md"
        log = Path(tempfile.gettempdir()) / "bounded-query-demo-events.jsonl"
        print(
            f"demo: staging {source} as example/widgets (internal) and example/vault"
            f" (sealed); JSONL events -> {log}\n",
            flush=True,
        )
        with _model(env) as (agents, stand_in_network):
            document = yaml.safe_load((EXAMPLE_DIR / "awf-config.yaml").read_text())
            config = work / "awf-config.json"
            config.write_text(json.dumps({**document, **agents}))
            options = RunOptions(
                config_source=str(config),
                agent=("python3", str(workspace / "agent.py")),
                seed_sources={"example/widgets": source, "example/vault": source},
                workspace=workspace,
                broker_log=log,
                # the stand-in is plain http on its own network
                allow_insecure_api_target=stand_in_network is not None,
                api_proxy_egress_network=stand_in_network,
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
