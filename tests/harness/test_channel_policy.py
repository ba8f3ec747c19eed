"""The cross-invocation channel policy (harness/configuration/channel_policy.py) and its hook."""

from __future__ import annotations

import itertools
import json
import os

import pytest
import trio

from bounded_query.broker.readiness import UNREADABLE, encode_ready
from bounded_query.broker.runner import PAGE_CACHE_PIN, Degradation
from bounded_query.harness.configuration.channel_policy import (
    ALLOW_FLAG,
    REMOVED_FLAG,
    ChannelDecision,
    channel_decision,
    pin_missing,
    shares_host,
)
from bounded_query.harness.configuration.config import BoundedQueriesConfig, PrivateRepo, Problem
from bounded_query.harness.configuration.preflight import PreflightInputs, static_problems
from bounded_query.harness.lifecycle.paths import run_paths

CLASSES = ("public", "internal", "confidential", "sealed")


@pytest.mark.parametrize(
    ("classes", "shares"),
    [
        (("public",), False),
        (("internal",), False),  # one repository: its channels leave through its own charge
        (("public", "public"), False),  # nothing secret between public repositories
        (("internal", "confidential"), True),  # the 8-bit budget through the 64-bit one
        (("internal", "internal"), True),  # one's facts on the other's budget
        (("public", "sealed"), False),  # sealed never runs a query
        (("confidential", "sealed", "sealed"), False),
        (("public", "internal"), True),
        (("public", "confidential", "sealed"), True),
        ((), False),
    ],
)
def test_what_counts_as_sharing_the_host(classes, shares):
    assert shares_host(classes) is shares


@pytest.mark.parametrize(
    ("runtime", "classes", "isolated", "pinned", "allow"),
    list(
        itertools.product(
            ("docker", "gvisor"),
            [c for n in range(1, 4) for c in itertools.combinations_with_replacement(CLASSES, n)],
            (True, False),
            (True, False),
            (True, False),
        )
    ),
)
def test_every_combination(runtime, classes, isolated, pinned, allow):
    """The whole table: refused exactly when sharing and a channel stays open, unless allowed."""
    decision = channel_decision(
        runtime, classes, isolated_storage=isolated, allow_open=allow, pinned=pinned
    )
    open_channel = shares_host(classes) and (runtime != "gvisor" or not isolated or not pinned)
    assert (decision.problem is not None) is (open_channel and not allow)
    assert (decision.degraded is not None) is (open_channel and allow)
    if decision.problem is not None:
        assert ALLOW_FLAG in decision.problem.hint
        assert "gvisor" in decision.problem.hint
        assert ("page-cache" in decision.problem.message) is (not pinned)
    if decision.degraded is not None:
        assert ALLOW_FLAG in decision.degraded
        assert ("inode" in decision.degraded) is (runtime != "gvisor" or not isolated)
        assert ("page-cache" in decision.degraded) is (not pinned)


def test_gvisor_as_root_with_the_pin_accepts_every_run():
    for classes in (("internal", "confidential"), ("public", "confidential"), ("internal",) * 3):
        decision = channel_decision(
            "gvisor", classes, isolated_storage=True, allow_open=False, pinned=True
        )
        assert decision == ChannelDecision()


@pytest.mark.parametrize(
    ("announced", "missing"),
    [
        ((), False),
        ((Degradation("workspace quota", "no tmpfs"),), False),
        ((Degradation(PAGE_CACHE_PIN, "could not start"),), True),
        ((UNREADABLE,), True),  # fail closed: the file may have listed the pin
    ],
)
def test_what_counts_as_a_missing_pin(announced, missing):
    assert pin_missing(announced) is missing


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


@pytest.mark.parametrize(
    "classes", [("public", "confidential"), ("internal", "confidential"), ("internal", "internal")]
)
def test_preflight_refuses_a_sharing_runc_run_with_the_fix(tmp_path, classes):
    problems = static_problems(_inputs(tmp_path, "docker", classes, isolated_storage=True))
    (problem,) = _channel_locations(problems)
    assert "runc" in problem.message
    assert "inode" in problem.message
    assert ALLOW_FLAG in problem.hint


def test_preflight_accepts_with_the_flag_or_on_gvisor_as_root(tmp_path):
    flagged = _inputs(tmp_path, "docker", ("public", "internal"), allow_open_channels=True)
    assert _channel_locations(static_problems(flagged)) == []
    gvisor = _inputs(tmp_path, "gvisor", ("public", "internal"), isolated_storage=True)
    assert _channel_locations(static_problems(gvisor)) == []
    # without per-invocation storage even gvisor leaves the workspace counter open
    shared = _inputs(tmp_path, "gvisor", ("public", "internal"), isolated_storage=False)
    assert len(_channel_locations(static_problems(shared))) == 1


def test_preflight_ignores_runs_that_do_not_share(tmp_path):
    for classes in (("public", "public"), ("confidential", "sealed"), ("internal",)):
        assert _channel_locations(static_problems(_inputs(tmp_path, "docker", classes))) == []


async def _mixed_run(
    tmp_path,
    docker_host: str,
    *,
    allow: bool,
    classes: tuple[str, str] = ("public", "confidential"),
    runtime: str = "docker",
    start_broker=None,
    agent: str = "pass",
):
    """One in-process ``run`` (fake broker) of two repositories (default: public and
    confidential on runc)."""
    import io
    import json
    import os
    import sys

    from bounded_query.harness import RunOptions, run
    from bounded_query.harness.records.events import EventSink
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
        {"repo": "octo/alpha", "sensitivity": classes[0]},
        {"repo": "octo/beta", "sensitivity": classes[1]},
    ]
    section = {
        "enabled": True,
        "memoryLimit": "64m",
        "privateRepos": repos,
        "runtime": runtime,
    }
    config.write_text(json.dumps({"boundedQueries": section}))
    stream = io.StringIO()
    with mount_safe_base() as base:
        options = RunOptions(
            config_source=str(config),
            agent=(sys.executable, "-c", agent),
            seed_sources=sources,
            workspace=tmp_path,
            base=base,
            broker_command=FAKE_BROKER,
            probe_runtime=False,
            allow_open_channels=allow,
            **HOST_AGENT,
        )
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(HARNESS_TESTS_ROOT),
            "DOCKER_HOST": docker_host,
        }
        status = await run(options, EventSink(stream), env, start_broker)
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


class _AnnouncingBroker:
    """A broker handle whose readiness file says what the test wants (pin or no pin)."""

    def __init__(self) -> None:
        self.stopped = False

    def exited(self) -> int | None:
        return None

    async def stop(self) -> int | None:
        self.stopped = True
        return 0

    async def relay_log(self, sink: object) -> None:
        del sink  # a fake with no output


def _announcing(announced, handles):
    async def start(options, paths, env):
        del options, env
        paths.ready_file.parent.mkdir(parents=True, exist_ok=True)
        paths.ready_file.write_text(encode_ready(os.getpid(), announced))
        handles.append(handle := _AnnouncingBroker())
        return handle

    return start


NO_PIN = Degradation(PAGE_CACHE_PIN, "the pin container could not start")


@pytest.mark.parametrize("classes", [("internal", "confidential"), ("public", "internal")])
async def test_a_missing_pin_refuses_a_sharing_run_before_the_agent_starts(
    tmp_path, classes, fake_engine
):
    """gVisor as root passes preflight; the broker then says the pin did not start."""
    from tests.harness.bq_harness_helpers import require_root

    require_root()
    handles: list[_AnnouncingBroker] = []
    status, events = await _mixed_run(
        tmp_path,
        fake_engine.docker_host,
        allow=False,
        classes=classes,
        runtime="gvisor",
        start_broker=_announcing([NO_PIN], handles),
    )
    kinds = [e["event"] for e in events]
    assert status == 2, events
    assert "preflight_passed" in kinds
    assert "broker_ready" in kinds
    assert "agent_started" not in kinds
    (refusal,) = [e for e in events if e["event"] == "preflight_error"]
    assert "page-cache" in refusal["message"]
    assert ALLOW_FLAG in refusal["hint"]
    assert handles[0].stopped, "teardown stopped the broker"


@pytest.mark.parametrize(
    ("announced", "classes", "allow"),
    [
        ((), ("internal", "confidential"), False),  # pinned: gVisor as root is accepted
        ([NO_PIN], ("confidential", "sealed"), False),  # one repository runs queries
        ([NO_PIN], ("internal", "confidential"), True),  # the operator accepts it
    ],
)
async def test_otherwise_the_agent_runs(tmp_path, announced, classes, allow, fake_engine):
    from tests.harness.bq_harness_helpers import require_root

    require_root()
    status, events = await _mixed_run(
        tmp_path,
        fake_engine.docker_host,
        allow=allow,
        classes=classes,
        runtime="gvisor",
        start_broker=_announcing(announced, []),
    )
    kinds = [e["event"] for e in events]
    assert status == 0, events
    assert "agent_started" in kinds
    degraded = {e["subsystem"] for e in events if e["event"] == "degraded"}
    assert (PAGE_CACHE_PIN in degraded) is bool(announced)
    assert ("cross-invocation channels" in degraded) is allow
    if allow:
        notices = [
            e["detail"]
            for e in events
            if e["subsystem" if "subsystem" in e else "event"] == "cross-invocation channels"
        ]
        assert any("page-cache" in n for n in notices), notices


async def test_an_unreadable_readiness_file_counts_as_no_pin(tmp_path, fake_engine):
    from tests.harness.bq_harness_helpers import require_root

    require_root()

    async def start(options, paths, env):
        paths.ready_file.parent.mkdir(parents=True, exist_ok=True)
        paths.ready_file.write_text("not json")
        return _AnnouncingBroker()

    status, events = await _mixed_run(
        tmp_path,
        fake_engine.docker_host,
        allow=False,
        classes=("internal", "internal"),
        runtime="gvisor",
        start_broker=start,
    )
    assert status == 2
    assert "agent_started" not in [e["event"] for e in events]


async def test_a_protection_lost_during_the_run_is_reported(tmp_path, fake_engine):
    """The broker rewrote its readiness file (it halted); the harness says so after the agent."""
    from tests.harness.bq_harness_helpers import require_root

    require_root()
    lost = Degradation(PAGE_CACHE_PIN, "the pin container stopped during the run")

    async def start(options, paths, env):
        paths.ready_file.parent.mkdir(parents=True, exist_ok=True)
        paths.ready_file.write_text(encode_ready(os.getpid(), []))
        handle = _AnnouncingBroker()

        async def halt_later() -> None:
            while True:
                if started.exists():  # the agent runs
                    break
                await trio.sleep(0.01)
            paths.ready_file.write_text(encode_ready(os.getpid(), [lost]))
            halted.touch()

        nursery.start_soon(halt_later)
        return handle

    started, halted = tmp_path / "agent-started", tmp_path / "broker-halted"
    agent = (
        f"import pathlib, time; pathlib.Path({str(started)!r}).touch()\n"
        f"while not pathlib.Path({str(halted)!r}).exists(): time.sleep(0.01)"
    )
    async with trio.open_nursery() as nursery:
        status, events = await _mixed_run(
            tmp_path,
            fake_engine.docker_host,
            allow=False,
            classes=("internal", "confidential"),
            runtime="gvisor",
            start_broker=start,
            agent=agent,
        )
    halts = [e for e in events if e["event"] == "broker_halted"]
    degraded = [e for e in events if e["event"] == "degraded"]
    assert status == 0, events
    assert [e["subsystem"] for e in halts] == [PAGE_CACHE_PIN], events
    assert any("stopped during the run" in e["detail"] for e in degraded)


def test_the_removed_flag_names_the_new_one(capsys):
    from bounded_query.harness.__main__ import main

    status = main(["run", "--config", "x.json", REMOVED_FLAG, "--", "true"])
    assert status == 2
    err = capsys.readouterr().err
    assert REMOVED_FLAG in err
    assert ALLOW_FLAG in err


@pytest.mark.parametrize(
    ("classes", "refused"), [(("internal", "sealed"), False), (("internal", "confidential"), True)]
)
async def test_a_non_root_harness_says_what_it_lacks(tmp_path, classes, refused):
    """euid != 0: no per-invocation storage; a degraded event and the summary name it, and
    the policy reads it as an open channel (a sharing run is refused)."""
    import io

    from bounded_query.harness.configuration.channel_policy import NON_ROOT_MISSING
    from bounded_query.harness.configuration.config import BoundedQueriesConfig, PrivateRepo
    from bounded_query.harness.lifecycle.options import RunOptions
    from bounded_query.harness.lifecycle.plan import plan_run
    from bounded_query.harness.lifecycle.prepare import execute_plan
    from bounded_query.harness.lifecycle.teardown import RunState, teardown
    from bounded_query.harness.records.events import EventSink
    from tests.harness.bq_harness_helpers import make_repo, mount_safe_base

    sources = {}
    for slug in ("octo/alpha", "octo/beta"):
        sources[slug] = tmp_path / slug.replace("/", "-")
        make_repo(sources[slug], {"README.md": "hi\n"})
    repos = (PrivateRepo("octo/alpha", classes[0]), PrivateRepo("octo/beta", classes[1]))
    config = BoundedQueriesConfig(enabled=True, private_repos=repos, memory_limit="64m")
    summary = tmp_path / "summary.md"
    env = {"PATH": os.environ["PATH"], "GITHUB_STEP_SUMMARY": str(summary)}
    stream = io.StringIO()
    sink = EventSink(stream)
    with mount_safe_base() as base:
        options = RunOptions(
            config_source="c.json",
            agent=("true",),
            seed_sources=sources,
            workspace=tmp_path,
            base=base,
            probe_runtime=False,
        )
        plan = plan_run(options, config, env, run_id="cd" * 16, uid=os.getuid(), euid=1000)
        state = RunState(config=config)
        ok = await execute_plan(plan, options, config, env, state, sink)
        await teardown(state, sink, env, status=0 if ok else 2, phase="agent", keep=None)
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    if refused:
        assert not ok
        (problem,) = [e for e in events if e["event"] == "preflight_error"]
        assert "workspace tmpfs" in problem["message"]
        return
    assert ok, events
    (event,) = [e for e in events if e.get("subsystem") == NON_ROOT_MISSING.subsystem]
    assert event["event"] == "degraded"
    assert "not root" in event["detail"]
    text = summary.read_text(encoding="utf-8")
    assert NON_ROOT_MISSING.subsystem in text
