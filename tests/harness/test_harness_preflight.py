"""Paths and fail-closed preflight (spec 14.2 "Preflight", 14.8)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from bounded_query.harness.configuration.config import (
    BoundedAgentsConfig,
    BoundedQueriesConfig,
    PrivateRepo,
)
from bounded_query.harness.configuration.preflight import (
    PreflightInputs,
    runtime_problems,
    staging_token,
    static_problems,
)
from bounded_query.harness.lifecycle.paths import (
    overlap_problems,
    overlaps,
    resolve_through_ancestor,
    run_paths,
)

REPOS = (PrivateRepo("octo/alpha", "internal"), PrivateRepo("octo/beta", "public"))


@pytest.fixture
def docker_sock(tmp_path):
    path = tmp_path / "docker.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    yield f"unix://{path}"
    server.close()


def make_inputs(tmp_path, docker_sock, **overrides):
    config = overrides.pop("config", BoundedQueriesConfig(enabled=True, private_repos=REPOS))
    env = overrides.pop("env", {"GH_TOKEN": "t0ken", "DOCKER_HOST": docker_sock})
    paths = overrides.pop("paths", run_paths(0, tmp_path / "ws", "ab" * 16, base=tmp_path / "vt"))
    # REPOS mixes public and internal on runc: the channel policy (tested in
    # test_channel_policy.py) would refuse it; these tests are about the rest
    overrides.setdefault("allow_open_channels", True)
    return PreflightInputs(config=config, paths=paths, env=env, **overrides)


def locations(problems):
    return sorted(p.location for p in problems)


def test_root_names_follow_the_spec():
    paths = run_paths(1000, Path("/work/ws"), "0123456789abcdef")
    assert paths.private_root.parent == Path("/var/tmp")
    assert paths.private_root.name.startswith("awf-bounded-query-private-1000-")
    assert paths.ingress_root.name.startswith("awf-bounded-query-ingress-1000-")
    digest = paths.private_root.name.rsplit("-", 1)[1]
    assert digest == paths.ingress_root.name.rsplit("-", 1)[1]
    assert len(digest) == 16
    assert run_paths(1000, Path("/work/ws"), "1123456789abcdef").private_root != paths.private_root
    assert paths.socket_path == paths.ingress_root / "run" / "broker.sock"
    assert paths.wrapper_dir.parent == paths.skill_dir


def test_resolve_through_longest_existing_ancestor_follows_symlinks(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert resolve_through_ancestor(tmp_path / "link" / "a" / "b") == real / "a" / "b"
    assert resolve_through_ancestor(tmp_path / "link" / "x" / ".." / "y") == real / "y"


def test_overlap_detects_containment_both_ways_and_through_symlinks(tmp_path):
    visible = tmp_path / "workspace"
    visible.mkdir()
    (visible / "sneaky").symlink_to(tmp_path / "vt")
    private = tmp_path / "vt" / "private"
    assert overlaps(private, visible / "sneaky")
    assert overlaps(visible, visible / "x" / "y")
    assert overlaps(visible / "x", visible)
    assert not overlaps(tmp_path / "vt2", tmp_path / "vt")
    problems = overlap_problems(private, [visible, visible / "sneaky"])
    assert len(problems) == 1
    assert "sneaky" in problems[0]


def test_good_inputs_pass(tmp_path, docker_sock):
    assert static_problems(make_inputs(tmp_path, docker_sock)) == []


@pytest.mark.parametrize(
    ("config", "location"),
    [
        (BoundedQueriesConfig(enabled=True), "boundedQueries.privateRepos"),
        (
            BoundedQueriesConfig(enabled=True, private_repos=(PrivateRepo("a/b\n", "internal"),)),
            "boundedQueries.privateRepos[0]",
        ),
        (
            BoundedQueriesConfig(
                enabled=True,
                private_repos=(
                    PrivateRepo("Octo/Alpha", "internal"),
                    PrivateRepo("octo/alpha", "public"),
                ),
            ),
            "boundedQueries.privateRepos[1]",
        ),
        (
            BoundedQueriesConfig(enabled=True, private_repos=REPOS, timeout=541),
            "boundedQueries.timeout",
        ),
        (
            BoundedQueriesConfig(enabled=True, private_repos=REPOS, interpreter="python2"),
            "boundedQueries.interpreter",
        ),
        (
            BoundedQueriesConfig(enabled=True, private_repos=REPOS, memory_limit="1t"),
            "boundedQueries.memoryLimit",
        ),
        (
            BoundedQueriesConfig(enabled=True, private_repos=REPOS, memory_limit="1k"),
            "boundedQueries.memoryLimit",
        ),
    ],
)
def test_each_static_check_fails_closed(tmp_path, docker_sock, config, location):
    problems = static_problems(make_inputs(tmp_path, docker_sock, config=config))
    assert locations(problems) == [location]
    assert problems[0].hint


def test_docker_host_must_be_a_unix_socket(tmp_path, docker_sock):
    for host in ("tcp://127.0.0.1:2375", "ssh://x", f"unix://{tmp_path}/missing.sock"):
        env = {"GH_TOKEN": "t", "DOCKER_HOST": host}
        assert locations(static_problems(make_inputs(tmp_path, docker_sock, env=env))) == [
            "DOCKER_HOST"
        ]
    (tmp_path / "file").write_text("")
    env = {"GH_TOKEN": "t", "DOCKER_HOST": f"unix://{tmp_path}/file"}
    assert "not a socket" in static_problems(make_inputs(tmp_path, docker_sock, env=env))[0].message


def test_credential_needed_only_for_remote_repositories(tmp_path, docker_sock):
    env = {"DOCKER_HOST": docker_sock, "GITHUB_TOKEN": "   "}
    problems = static_problems(make_inputs(tmp_path, docker_sock, env=env))
    assert locations(problems) == ["GH_TOKEN/GITHUB_TOKEN"]
    assert "octo/alpha, octo/beta" in problems[0].message
    sources = {"octo/alpha": tmp_path, "octo/beta": tmp_path}
    assert static_problems(make_inputs(tmp_path, docker_sock, env=env, seed_sources=sources)) == []
    assert staging_token({"GITHUB_TOKEN": "b", "GH_TOKEN": "a"}) == "a"
    assert staging_token({"GITHUB_TOKEN": "b"}) == "b"


def test_seed_source_must_be_configured_and_exist(tmp_path, docker_sock):
    sources = {"octo/gamma": tmp_path, "octo/alpha": tmp_path / "missing"}
    problems = static_problems(make_inputs(tmp_path, docker_sock, seed_sources=sources))
    assert locations(problems) == ["--seed-source octo/alpha", "--seed-source octo/gamma"]


def test_a_seed_source_may_name_an_enabled_bounded_agent_repository(tmp_path, docker_sock):
    sources = {"octo/gamma": tmp_path}
    agents = BoundedAgentsConfig(enabled=True, private_repos=(PrivateRepo("Octo/Gamma", "sealed"),))
    assert (
        static_problems(make_inputs(tmp_path, docker_sock, seed_sources=sources, agents=agents))
        == []
    )
    disabled = BoundedAgentsConfig(private_repos=agents.private_repos)
    problems = static_problems(
        make_inputs(tmp_path, docker_sock, seed_sources=sources, agents=disabled)
    )
    assert locations(problems) == ["--seed-source octo/gamma"]


def test_private_root_overlapping_agent_visible_path_fails(tmp_path, docker_sock):
    paths = run_paths(0, tmp_path, "cd" * 16, base=tmp_path / "vt")
    visible = (tmp_path / "vt",)
    problems = static_problems(
        make_inputs(tmp_path, docker_sock, paths=paths, agent_visible=visible)
    )
    assert locations(problems) == ["private root"]
    assert (
        static_problems(
            make_inputs(tmp_path, docker_sock, paths=paths, agent_visible=(tmp_path / "other",))
        )
        == []
    )


async def test_sbx_is_always_blocked_with_a_report():
    config = BoundedQueriesConfig(enabled=True, private_repos=REPOS, runtime="sbx")
    problems = await runtime_problems(config, "unix:///nonexistent", "img", "ab" * 8)
    assert len(problems) == 1
    assert "sbx is a fail-closed preview and is blocked" in problems[0].message


async def test_unreachable_engine_fails(tmp_path):
    config = BoundedQueriesConfig(enabled=True, private_repos=REPOS)
    problems = await runtime_problems(config, f"unix://{tmp_path}/no.sock", "img", "ab" * 8)
    assert [p.location for p in problems] == ["docker"]


@pytest.mark.engine
async def test_missing_image_fails_against_real_engine(docker_client):
    config = BoundedQueriesConfig(enabled=True, private_repos=REPOS)
    problems = await runtime_problems(
        config, "unix:///var/run/docker.sock", "bounded-query-no-such-image:0", "ab" * 8
    )
    assert [p.location for p in problems] == ["image"]


def test_uid_in_root_name_is_the_callers():
    paths = run_paths(os.getuid(), Path.cwd(), "ef" * 8)
    assert f"-{os.getuid()}-" in paths.private_root.name
