"""The cross-invocation channel policy (harness/channel_policy.py, issue 9) and its hook."""

from __future__ import annotations

import itertools
import json

import pytest
from bounded_query.harness.channel_policy import (
    ALLOW_FLAG,
    ChannelDecision,
    channel_decision,
    mixes_sensitivity,
)
from bounded_query.harness.config import BoundedQueriesConfig, PrivateRepo, Problem
from bounded_query.harness.paths import run_paths
from bounded_query.harness.preflight import PreflightInputs, static_problems

CLASSES = ("public", "internal", "confidential", "sealed")


@pytest.mark.parametrize(
    ("classes", "mixed"),
    [
        (("public",), False),
        (("internal", "confidential"), False),
        (("public", "sealed"), False),  # sealed never runs a query
        (("public", "internal"), True),
        (("public", "confidential", "sealed"), True),
        ((), False),
    ],
)
def test_what_counts_as_mixed(classes, mixed):
    assert mixes_sensitivity(classes) is mixed


@pytest.mark.parametrize(
    ("runtime", "classes", "isolated", "allow"),
    list(
        itertools.product(
            ("docker", "gvisor"),
            [c for n in range(1, 4) for c in itertools.combinations(CLASSES, n)],
            (True, False),
            (True, False),
        )
    ),
)
def test_every_combination(runtime, classes, isolated, allow):
    """The whole table: refused exactly when mixed and a channel stays open, unless allowed."""
    decision = channel_decision(runtime, classes, isolated_storage=isolated, allow_mixed=allow)
    open_channel = mixes_sensitivity(classes) and (runtime != "gvisor" or not isolated)
    assert (decision.problem is not None) is (open_channel and not allow)
    assert (decision.degraded is not None) is (open_channel and allow)
    if decision.problem is not None:
        assert ALLOW_FLAG in decision.problem.hint
        assert "gvisor" in decision.problem.hint
    if decision.degraded is not None:
        assert ALLOW_FLAG in decision.degraded
        assert ("inode" in decision.degraded) is (runtime != "gvisor" or not isolated)


def test_a_decision_is_never_both():
    with pytest.raises(ValueError, match="no degraded notice"):
        ChannelDecision(problem=Problem("x", "y", "z"), degraded="w")


def _inputs(tmp_path, runtime, classes, **kw):
    repos = tuple(PrivateRepo(f"octo/r{i}", c) for i, c in enumerate(classes))
    config = BoundedQueriesConfig(enabled=True, private_repos=repos, runtime=runtime)
    paths = run_paths(0, tmp_path / "ws", "ab" * 16, base=tmp_path / "vt")
    env = {"GH_TOKEN": "t0ken", "DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    return PreflightInputs(config=config, paths=paths, env=env, **kw)


def _channel_locations(problems):
    return [p for p in problems if p.location == "boundedQueries.privateRepos"]


def test_preflight_refuses_a_mixed_runc_run_with_the_fix(tmp_path):
    problems = static_problems(_inputs(tmp_path, "docker", ("public", "confidential")))
    (problem,) = _channel_locations(problems)
    assert "runc" in problem.message
    assert ALLOW_FLAG in problem.hint


def test_preflight_accepts_with_the_flag_or_on_gvisor_as_root(tmp_path):
    flagged = _inputs(tmp_path, "docker", ("public", "internal"), allow_mixed_sensitivity=True)
    assert _channel_locations(static_problems(flagged)) == []
    gvisor = _inputs(tmp_path, "gvisor", ("public", "internal"), isolated_storage=True)
    assert _channel_locations(static_problems(gvisor)) == []
    # without per-invocation storage even gvisor leaves the workspace counter open
    shared = _inputs(tmp_path, "gvisor", ("public", "internal"), isolated_storage=False)
    assert len(_channel_locations(static_problems(shared))) == 1


def test_preflight_ignores_unmixed_runs(tmp_path):
    for classes in (("public", "public"), ("internal", "confidential", "sealed")):
        assert _channel_locations(static_problems(_inputs(tmp_path, "docker", classes))) == []


async def _mixed_run(tmp_path, docker_host: str, *, allow: bool):
    """One in-process ``run`` (fake broker) of a public and a confidential repository on runc."""
    import io
    import json
    import os
    import sys

    from bounded_query.harness import RunOptions, run
    from bounded_query.harness.events import EventSink

    from tests.harness.bq_harness_helpers import (
        FAKE_BROKER,
        HARNESS_TESTS_ROOT,
        HOST_AGENT,
        make_repo,
        mount_safe_base,
    )

    sources = {}
    for slug in ("octo/alpha", "octo/beta"):
        sources[slug] = tmp_path / slug.replace("/", "-")
        make_repo(sources[slug], {"README.md": "hi\n"})
    config = tmp_path / "c.json"
    repos = [
        {"repo": "octo/alpha", "sensitivity": "public"},
        {"repo": "octo/beta", "sensitivity": "confidential"},
    ]
    section = {"enabled": True, "memoryLimit": "64m", "privateRepos": repos}
    config.write_text(json.dumps({"boundedQueries": section}))
    stream = io.StringIO()
    with mount_safe_base() as base:
        options = RunOptions(
            config_source=str(config),
            agent=(sys.executable, "-c", "pass"),
            seed_sources=sources,
            workspace=tmp_path,
            base=base,
            broker_command=FAKE_BROKER,
            probe_runtime=False,
            allow_mixed_sensitivity=allow,
            **HOST_AGENT,
        )
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(HARNESS_TESTS_ROOT),
            "DOCKER_HOST": docker_host,
        }
        status = await run(options, EventSink(stream), env)
    return status, [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_the_harness_refuses_a_mixed_runc_run(tmp_path, fake_engine):
    status, events = await _mixed_run(tmp_path, fake_engine.docker_host, allow=False)
    assert status == 2
    kinds = [e["event"] for e in events]
    assert "preflight_failed" in kinds
    assert "broker_started" not in kinds
    assert "broker_ready" not in kinds
    assert ALLOW_FLAG in json.dumps(events)


async def test_the_flag_accepts_it_degraded(tmp_path, fake_engine):
    from tests.harness.bq_harness_helpers import require_root

    require_root()
    status, events = await _mixed_run(tmp_path, fake_engine.docker_host, allow=True)
    assert status == 0, events
    assert "broker_ready" in [e["event"] for e in events]
    degraded = [e for e in events if e["event"] == "degraded"]
    assert any(e["subsystem"] == "cross-invocation channels" for e in degraded), degraded
