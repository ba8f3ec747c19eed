"""The pure planning of a run (harness/lifecycle/plan.py): no engine, no file system, no trio.

* ``plan_run``: the roots, the Docker host, what the agent can see, what is
  staged, the channel decision and the broker configuration, from the
  options, the configuration, the environment and the process's ids.
* ``choose_agent_user``, ``plan_teardown``, ``summary_kind``,
  ``final_status``: tables of every case the harness distinguishes.
"""

from __future__ import annotations

import itertools
import signal
from pathlib import Path

import pytest

from bounded_query.broker.protocol.policy import DEFAULT_DOCKER_HOST, DEFAULT_IMAGE
from bounded_query.harness.agent.spec import DEFAULT_AGENT_UID, AgentUser
from bounded_query.harness.configuration.config import BoundedQueriesConfig, PrivateRepo
from bounded_query.harness.lifecycle.options import RunOptions
from bounded_query.harness.lifecycle.paths import INGRESS_PREFIX, PRIVATE_PREFIX, run_paths
from bounded_query.harness.lifecycle.plan import (
    TeardownPlan,
    choose_agent_user,
    final_status,
    plan_run,
    plan_teardown,
    summary_kind,
)
from bounded_query.harness.lifecycle.sweep import MODE_COMPOSE, MODE_RUN

RUN_ID = "0123456789abcdef0123456789abcdef"
CONFIG = BoundedQueriesConfig(
    enabled=True,
    private_repos=(
        PrivateRepo("Octo/Alpha", "internal"),
        PrivateRepo("octo/vault", "sealed"),
        PrivateRepo("octo/docs", "public"),
    ),
)


def _options(tmp: Path, **extra) -> RunOptions:
    return RunOptions(
        config_source="awf.yaml",
        agent=("true",),
        seed_sources={"octo/alpha": tmp / "alpha-src"},
        # Neither exists: planning must not need them (or create them).
        workspace=tmp / "ws",
        base=tmp / "base",
        **extra,
    )


def test_plan_derives_the_roots_and_touches_nothing(tmp_path):
    options = _options(tmp_path)
    plan = plan_run(options, CONFIG, {}, run_id=RUN_ID, uid=1234, euid=1234)
    assert plan.paths == run_paths(1234, tmp_path / "ws", RUN_ID, tmp_path / "base")
    assert plan.paths.private_root.name.startswith(f"{PRIVATE_PREFIX}1234-")
    assert plan.paths.ingress_root.name.startswith(f"{INGRESS_PREFIX}1234-")
    assert plan.run_id == RUN_ID
    assert plan.uid == 1234
    assert list(tmp_path.iterdir()) == []  # nothing was created


def test_another_run_id_gives_other_roots(tmp_path):
    options = _options(tmp_path)
    one = plan_run(options, CONFIG, {}, run_id=RUN_ID, uid=0, euid=0)
    two = plan_run(options, CONFIG, {}, run_id=RUN_ID[::-1], uid=0, euid=0)
    assert one.paths.private_root != two.paths.private_root
    assert one.paths.ingress_root != two.paths.ingress_root


@pytest.mark.parametrize(
    ("env", "host"),
    [
        ({}, DEFAULT_DOCKER_HOST),
        ({"DOCKER_HOST": ""}, DEFAULT_DOCKER_HOST),
        ({"DOCKER_HOST": "unix:///run/other.sock"}, "unix:///run/other.sock"),
        ({"DOCKER_HOST": "tcp://10.0.0.1:2375"}, "tcp://10.0.0.1:2375"),
    ],
)
def test_docker_host_reaches_preflight_and_the_broker(tmp_path, env, host):
    plan = plan_run(_options(tmp_path), CONFIG, env, run_id=RUN_ID, uid=1, euid=1)
    assert plan.docker_host == host
    assert plan.broker_config["dockerHost"] == host


@pytest.mark.parametrize(
    ("home", "visible_home"),
    [("/home/agent", True), ("relative/home", False), ("", False), (None, False)],
)
def test_agent_visible_paths(tmp_path, home, visible_home):
    mounts = (tmp_path / "m1", tmp_path / "m2")
    env = {} if home is None else {"HOME": home}
    plan = plan_run(
        _options(tmp_path, agent_mounts=mounts), CONFIG, env, run_id=RUN_ID, uid=1, euid=1
    )
    expected = (Path("/tmp"), tmp_path / "ws", *([Path(home)] if visible_home else []), *mounts)
    assert plan.preflight.agent_visible == expected


@pytest.mark.parametrize(("euid", "isolated"), [(0, True), (1000, False)])
def test_isolated_storage_only_as_root(tmp_path, euid, isolated):
    plan = plan_run(_options(tmp_path), CONFIG, {}, run_id=RUN_ID, uid=euid, euid=euid)
    assert plan.preflight.isolated_storage is isolated


def test_preflight_inputs_carry_the_options(tmp_path):
    options = _options(tmp_path, allow_insecure_server=True, allow_open_channels=True)
    env = {"GITHUB_SERVER_URL": "http://127.0.0.1:1"}
    plan = plan_run(options, CONFIG, env, run_id=RUN_ID, uid=1, euid=1)
    assert plan.preflight.config is CONFIG
    assert plan.preflight.paths == plan.paths
    assert plan.preflight.env == env
    assert plan.preflight.seed_sources == {"octo/alpha": tmp_path / "alpha-src"}
    assert plan.preflight.allow_insecure_server is True
    assert plan.preflight.allow_open_channels is True


def test_seeds_in_configuration_order_with_their_local_source(tmp_path):
    plan = plan_run(_options(tmp_path), CONFIG, {}, run_id=RUN_ID, uid=1, euid=1)
    assert [s.repo for s in plan.seeds] == list(CONFIG.private_repos)
    # --seed-source keys are lowercased slugs; the configured spelling is kept.
    assert [s.source for s in plan.seeds] == [tmp_path / "alpha-src", None, None]


@pytest.mark.parametrize(
    ("runtime", "euid", "allow", "degraded"),
    [
        ("docker", 0, True, True),  # runc channels stay open: degraded when allowed
        ("docker", 0, False, False),  # ... refused by preflight instead (no notice here)
        ("gvisor", 0, True, False),  # gVisor as root closes them
        ("gvisor", 1000, True, True),  # shared storage without root
    ],
)
def test_channel_decision_for_a_mixed_run(tmp_path, runtime, euid, allow, degraded):
    config = BoundedQueriesConfig(
        enabled=True,
        private_repos=(PrivateRepo("octo/a", "public"), PrivateRepo("octo/b", "internal")),
        runtime=runtime,
    )
    options = _options(tmp_path, allow_open_channels=allow)
    plan = plan_run(options, config, {}, run_id=RUN_ID, uid=euid, euid=euid)
    assert (plan.channels.degraded is not None) is degraded
    assert (plan.channels.problem is not None) is (not allow and runtime == "docker")


def test_unmixed_run_has_no_channel_notice(tmp_path):
    plan = plan_run(
        _options(tmp_path), BoundedQueriesConfig(enabled=True), {}, run_id=RUN_ID, uid=1, euid=1
    )
    assert plan.channels.degraded is None
    assert plan.channels.problem is None


@pytest.mark.parametrize("gid", [None, 20000])
def test_broker_config_document(tmp_path, gid):
    options = _options(tmp_path, image="bounded-query-python:test")
    plan = plan_run(options, CONFIG, {}, run_id=RUN_ID, uid=1, euid=1, socket_gid=gid)
    doc = plan.broker_config
    assert plan.socket_gid == gid
    assert doc["runId"] == RUN_ID
    assert doc["socketGid"] == gid
    assert doc["socketPath"] == str(plan.paths.socket_path)
    assert doc["privateRoot"] == str(plan.paths.private_root)
    assert doc["seedMap"] == str(plan.paths.seed_map)
    assert doc["image"] == "bounded-query-python:test"
    assert doc["runtime"] == CONFIG.runtime
    assert doc["maxInvocations"] == CONFIG.max_invocations


def test_default_image_and_owner_mode(tmp_path):
    run_plan = plan_run(_options(tmp_path), CONFIG, {}, run_id=RUN_ID, uid=1, euid=1)
    assert run_plan.broker_config["image"] == DEFAULT_IMAGE
    assert run_plan.owner_mode == MODE_RUN
    compose_plan = plan_run(
        _options(tmp_path), CONFIG, {}, run_id=RUN_ID, uid=1, euid=1, owner_mode=MODE_COMPOSE
    )
    assert compose_plan.owner_mode == MODE_COMPOSE


# -- the agent's user ---------------------------------------------------------

DEFAULT = AgentUser(DEFAULT_AGENT_UID, DEFAULT_AGENT_UID)


@pytest.mark.parametrize(
    ("on_host", "given", "owner", "expected"),
    [
        (False, None, (1000, 1001), AgentUser(1000, 1001)),  # the workspace owner
        (False, None, (1000, 0), AgentUser(1000, 1000)),  # ... never group 0
        (False, None, (0, 0), DEFAULT),  # a root-owned workspace
        (False, None, None, DEFAULT),  # an unreadable workspace
        (False, AgentUser(4242, 4243), (1000, 1000), AgentUser(4242, 4243)),  # --agent-user
        (True, AgentUser(4242, 4243), None, AgentUser(4242, 4243)),
        (True, None, (1000, 1000), None),  # host: the harness's uid (refused unless unconfined)
    ],
)
def test_choose_agent_user(tmp_path, on_host, given, owner, expected):
    options = _options(tmp_path, agent_on_host=on_host, agent_user=given)
    assert choose_agent_user(options, owner) == expected


# -- teardown -----------------------------------------------------------------

UNIX = "unix:///var/run/docker.sock"


@pytest.mark.parametrize(
    ("where", "got_to", "plan"),
    [
        (
            "config or agent mode refused",
            {"paths_known": False, "roots_created": False, "docker_host": ""},
            TeardownPlan(False, False, False, False, None, False),
        ),
        (
            "preflight failed",
            {"paths_known": False, "roots_created": False, "docker_host": UNIX},
            TeardownPlan(False, False, False, False, None, False),
        ),
        (
            "staging failed",
            {"paths_known": True, "roots_created": True, "docker_host": UNIX},
            TeardownPlan(False, False, True, False, Path("/keep"), True),
        ),
        (
            "full run",
            {
                "broker_started": True,
                "progress_followed": True,
                "paths_known": True,
                "roots_created": True,
                "docker_host": UNIX,
                "work_quota": True,
            },
            TeardownPlan(True, True, True, True, Path("/keep"), True),
        ),
        (
            "remote engine: nothing to reconcile from here",
            {
                "broker_started": True,
                "paths_known": True,
                "roots_created": True,
                "docker_host": "tcp://10.0.0.1:2375",
            },
            TeardownPlan(True, False, False, False, Path("/keep"), True),
        ),
    ],
)
def test_teardown_plan_by_phase(where, got_to, plan):
    facts = {"broker_started": False, "progress_followed": False, "work_quota": False, **got_to}
    assert plan_teardown(**facts, keep_state=Path("/keep")) == plan, where


@pytest.mark.parametrize(
    "facts",
    [
        dict(zip(("b", "p", "k", "r", "q"), bits, strict=True))
        for bits in itertools.product((0, 1), repeat=5)
    ],
)
def test_teardown_plan_never_outruns_what_exists(facts):
    """Every combination: nothing under the roots is touched unless they are known."""
    plan = plan_teardown(
        broker_started=bool(facts["b"]),
        progress_followed=bool(facts["p"]),
        paths_known=bool(facts["k"]),
        roots_created=bool(facts["r"]),
        docker_host=UNIX,
        work_quota=bool(facts["q"]),
        keep_state=None,
    )
    assert plan.stop_broker is bool(facts["b"])  # a started broker is always stopped
    assert plan.remove_roots is bool(facts["k"] and facts["r"])
    assert plan.reconcile is bool(facts["r"])
    assert plan.unmount_quota is bool(facts["q"] and facts["k"])
    assert plan.drain_progress is bool(facts["p"] and facts["k"])
    assert plan.keep_state is None


@pytest.mark.parametrize(
    ("config_known", "paths_known", "phase", "kind"),
    [
        (False, False, "config", "none"),
        (False, True, "agent", "none"),
        (True, False, "preflight", "failed-early"),
        (True, True, "preflight", "failed-early"),
        (True, False, "broker", "failed-early"),
        (True, True, "broker", "usage"),
        (True, True, "agent", "usage"),
    ],
)
def test_summary_kind(config_known, paths_known, phase, kind):
    assert summary_kind(config_known=config_known, paths_known=paths_known, phase=phase) == kind


@pytest.mark.parametrize(
    ("status", "signum", "agent_done", "final"),
    [
        (0, None, True, 0),
        (7, None, True, 7),
        (2, None, False, 2),  # a harness failure
        (143, signal.SIGTERM, True, 143),  # the agent exited (forwarded signal): its status
        (0, signal.SIGTERM, True, 0),  # the agent handled the signal and exited 0
        (2, signal.SIGINT, False, 128 + signal.SIGINT),  # stopped before the agent finished
        (2, signal.SIGHUP, False, 128 + signal.SIGHUP),
    ],
)
def test_final_status(status, signum, agent_done, final):
    assert final_status(status, signum, agent_done) == final
