"""The agent's container body, environment, user and mode rules, as values (issue 8)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bounded_query.broker.protocol.policy import LABEL_OWNER, LABEL_ROLE, LABEL_RUN
from bounded_query.harness.__main__ import main
from bounded_query.harness.agent.hostcheck import HostCheck, evaluate
from bounded_query.harness.agent.spec import (
    DEFAULT_AGENT_UID,
    AgentContainer,
    AgentUser,
    agent_environment,
    container_body,
    default_agent_user,
    parse_agent_user,
)
from bounded_query.harness.configuration.config import Problem
from bounded_query.harness.lifecycle.options import RunOptions
from bounded_query.harness.lifecycle.plan import agent_mode_problems
from bounded_query.harness.staging.tokens import environ_block_bounds

WS = "/var/tmp/ws"
SOCK = "/var/tmp/awf-bounded-query-ingress-0-abc/run"
SKILL = "/var/tmp/awf-bounded-query-ingress-0-abc/skill"
PRIVATE = "/var/tmp/awf-bounded-query-private-0-abc"


def spec(**changes: object) -> AgentContainer:
    base = AgentContainer(
        image="bounded-query-agent:latest",
        argv=("python3", "agent.py"),
        workspace=WS,
        socket_dir=SOCK,
        skill_dir=SKILL,
        env={"B": "2", "A": "1"},
        user=AgentUser(1234, 5678),
        run_id="r" * 32,
        owner='{"pid": 1}',
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_body_has_exactly_the_three_mounts_at_their_host_paths():
    body = container_body(spec())
    mounts = body["HostConfig"]["Mounts"]  # type: ignore[index]
    assert [(m["Source"], m["Target"], m["ReadOnly"], m["Type"]) for m in mounts] == [
        (WS, WS, False, "bind"),
        (SOCK, SOCK, False, "bind"),
        (SKILL, SKILL, True, "bind"),
    ]
    assert "Binds" not in body["HostConfig"]  # type: ignore[operator]
    assert "Volumes" not in body
    assert "docker.sock" not in json.dumps(body)
    assert PRIVATE not in json.dumps(body)


def test_body_drops_every_privilege():
    host = container_body(spec())["HostConfig"]
    assert host["CapDrop"] == ["ALL"]  # type: ignore[index]
    assert "CapAdd" not in host  # type: ignore[operator]
    assert host["SecurityOpt"] == ["no-new-privileges:true"]  # type: ignore[index]
    assert host["Privileged"] is False  # type: ignore[index]
    assert host["PidMode"] == ""  # type: ignore[index]
    assert host["IpcMode"] == "private"  # type: ignore[index]
    assert host["GroupAdd"] == []  # type: ignore[index]
    assert host["Devices"] == []  # type: ignore[index]
    assert host["Init"] is True  # type: ignore[index]
    assert "UsernsMode" not in host  # type: ignore[operator]
    assert "CpusetCpus" not in host  # type: ignore[operator]


def test_body_user_command_environment_labels():
    body = container_body(spec())
    assert body["User"] == "1234:5678"
    assert body["Image"] == "bounded-query-agent:latest"
    assert body["Cmd"] == ["python3", "agent.py"]
    assert body["WorkingDir"] == WS
    assert body["Env"] == ["A=1", "B=2"]
    assert body["Labels"] == {LABEL_RUN: "r" * 32, LABEL_ROLE: "agent", LABEL_OWNER: '{"pid": 1}'}
    assert body["Tty"] is False
    assert body["OpenStdin"] is False
    assert body["AttachStdout"] is True
    assert body["AttachStderr"] is True


def test_body_tty_network_and_cpuset():
    body = container_body(spec(tty=True, network="none", cpuset="1"))
    assert body["Tty"] is True
    assert body["OpenStdin"] is True
    assert body["AttachStdin"] is True
    assert body["StdinOnce"] is True
    assert body["NetworkDisabled"] is True
    assert body["HostConfig"]["NetworkMode"] == "none"  # type: ignore[index]
    assert body["HostConfig"]["CpusetCpus"] == "1"  # type: ignore[index]
    assert container_body(spec())["HostConfig"]["NetworkMode"] == "bridge"  # type: ignore[index]
    assert container_body(spec())["NetworkDisabled"] is False


def test_extra_labels_cannot_override_ours():
    body = container_body(spec(labels={LABEL_RUN: "x", LABEL_ROLE: "query", "k": "v"}))
    assert body["Labels"][LABEL_RUN] == "r" * 32  # type: ignore[index]
    assert body["Labels"][LABEL_ROLE] == "agent"  # type: ignore[index]
    assert body["Labels"]["k"] == "v"  # type: ignore[index]


@pytest.mark.parametrize(
    "changes",
    [
        {"network": "host"},
        {"network": "container:abc"},
        {"network": "container"},
        {"network": "a b"},
        {"network": ""},
        {"workspace": "relative"},
        {"workspace": SOCK},
        {"skill_dir": "/x\0y"},
        {"argv": ()},
        {"image": ""},
        {"image": "a b"},
        {"run_id": ""},
    ],
)
def test_invalid_container_specs_cannot_exist(changes):
    with pytest.raises(ValueError, match=r"."):
        spec(**changes)


@pytest.mark.parametrize(("text", "user"), [("1000", (1000, 1000)), ("1000:50", (1000, 50))])
def test_parse_agent_user(text, user):
    parsed = parse_agent_user(text)
    assert (parsed.uid, parsed.gid) == user
    assert str(parsed) == f"{user[0]}:{user[1]}"


@pytest.mark.parametrize(
    "text",
    ["0", "0:0", "1000:0", "root", "-1", "1:", ":1", "1:2:3", "", "4294967295", " 1", "1" * 30],
)
def test_bad_agent_users_are_refused(text):
    with pytest.raises(ValueError, match=r"."):
        parse_agent_user(text)


def test_default_agent_user_is_the_workspace_owner_unless_root():
    assert default_agent_user(1000, 1000) == AgentUser(1000, 1000)
    assert default_agent_user(1000, 0) == AgentUser(1000, 1000)
    assert default_agent_user(0, 1000) == AgentUser(DEFAULT_AGENT_UID, DEFAULT_AGENT_UID)
    assert default_agent_user(0, 0) == AgentUser(DEFAULT_AGENT_UID, DEFAULT_AGENT_UID)
    assert DEFAULT_AGENT_UID not in (0, 65534)


CALLER = {
    "GH_TOKEN": "t1",
    "GITHUB_TOKEN": "t2",
    "DOCKER_HOST": "unix:///var/run/docker.sock",
    "DOCKER_CONFIG": "/root/.docker",
    "LEAK": f"{PRIVATE}/seeds",
    "OTHER_ROOT": "/var/tmp/awf-bounded-query-private-0-zzz",
    "PATH": "/usr/local/bin:/usr/bin",
    "HOME": "/root",
    "PWD": "/root/x",
    "OPENAI_API_KEY": "model-key",
    "LANG": "C.UTF-8",
}


def env_for(container: bool) -> dict[str, str]:
    return agent_environment(
        CALLER,
        socket_path=f"{SOCK}/broker.sock",
        skill_file=f"{SKILL}/SKILL.md",
        slugs=("o/a", "o/b"),
        wrapper_dir=f"{SKILL}/bin",
        private_root=PRIVATE,
        container=container,
    )


@pytest.mark.parametrize("container", [True, False])
def test_agent_environment_drops_tokens_docker_and_the_private_root(container):
    env = env_for(container)
    for name in ("GH_TOKEN", "GITHUB_TOKEN", "DOCKER_HOST", "DOCKER_CONFIG", "LEAK", "OTHER_ROOT"):
        assert name not in env
    assert env["OPENAI_API_KEY"] == "model-key"
    assert env["LANG"] == "C.UTF-8"
    assert env["AWF_BOUNDED_QUERY_SOCKET"] == f"{SOCK}/broker.sock"
    assert env["AWF_BOUNDED_QUERY_SKILL"] == f"{SKILL}/SKILL.md"
    assert env["AWF_BOUNDED_QUERY_REPOS"] == "o/a,o/b"
    assert env["PATH"].split(":")[0] == f"{SKILL}/bin"
    assert "awf-bounded-query-private-" not in json.dumps(env)


def test_container_environment_replaces_host_paths():
    env = env_for(True)
    assert env["HOME"] == "/tmp"
    assert "PWD" not in env
    system = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert env["PATH"] == f"{SKILL}/bin:{system}"
    host = env_for(False)
    assert host["HOME"] == "/root"
    assert host["PATH"] == f"{SKILL}/bin:/usr/local/bin:/usr/bin"


def options(**changes: object) -> RunOptions:
    return dataclasses.replace(RunOptions(config_source="-", agent=("a",)), **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "user", "harness_uid", "where"),
    [
        ({}, AgentUser(20000, 20000), 0, None),
        ({"agent_on_host": True}, None, 0, "--agent-on-host"),
        ({"agent_on_host": True}, None, 1000, "--agent-on-host"),
        ({"agent_on_host": True, "unconfined_agent": True}, None, 0, None),
        ({"agent_on_host": True}, AgentUser(1000, 1000), 0, None),
        ({"agent_on_host": True}, AgentUser(1000, 1000), 1001, "--agent-user"),
        ({"agent_on_host": True}, AgentUser(1000, 1000), 1000, None),
        ({"unconfined_agent": True}, AgentUser(20000, 20000), 0, "--unconfined-agent"),
    ],
)
def test_agent_mode_rules(changes, user, harness_uid, where):
    problems = agent_mode_problems(options(**changes), user, harness_uid)
    assert [p.location for p in problems] == ([] if where is None else [where])
    assert all(isinstance(p, Problem) and p.hint for p in problems)


@pytest.mark.parametrize("workspace", ["/var/run", "/", "/var/run/docker.sock", "/run/.."])
def test_a_workspace_holding_the_docker_socket_is_refused(workspace):
    problems = agent_mode_problems(options(workspace=Path(workspace)), AgentUser(1, 1), 0)
    assert [p.location for p in problems] == ["--workspace"]
    assert agent_mode_problems(options(workspace=Path("/var/tmp/ws")), AgentUser(1, 1), 0) == []


def test_cli_refuses_root_as_agent_user(capsys):
    assert main(["run", "--config", "-", "--agent-user", "0", "--", "true"]) == 2
    assert "usage_error" in capsys.readouterr().err


CHECK = HostCheck(
    user=AgentUser(20002, 20002),
    private_root=Path(PRIVATE),
    journal=Path(PRIVATE, "state/journal"),
    socket_path=Path(SOCK, "broker.sock"),
    pids=(10, 11),
    docker_host="unix:///var/run/docker.sock",
)
GOOD = {
    "private_root_traverse": "denied",
    "private_root_list": "denied",
    "journal_write": "denied",
    "docker_socket_connect": "denied",
    "docker_socket_open": "denied",
    "environ:10": "denied",
    "environ:11": "denied",
    "broker_socket": "connected",
    "groups": [20002],
    "uid": 20002,
}


def test_host_check_passes_a_confined_user():
    assert evaluate(CHECK, GOOD, docker_gid=105) == []


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"private_root_traverse": "reached"}, "traverse the private root"),
        ({"private_root_list": "reached"}, "list the private root"),
        ({"journal_write": "reached"}, "journal"),
        ({"docker_socket_connect": "reached"}, "Docker socket"),
        ({"docker_socket_open": "reached"}, "Docker socket"),
        ({"environ:11": "reached"}, "/proc/11/environ"),
        ({"environ:10": None}, "did not answer"),
        ({"broker_socket": "failed"}, "cannot connect to the broker socket"),
        ({"groups": [20002, 105]}, "group 105"),
        ({"groups": None}, "groups"),
        ({"uid": 0}, "uid"),
    ],
)
def test_host_check_refuses_every_reachable_secret(changes, fragment):
    answer = {k: v for k, v in {**GOOD, **changes}.items() if v is not None}
    problems = evaluate(CHECK, answer, docker_gid=105)
    assert problems, changes
    assert any(fragment in p.message for p in problems), problems


def test_environ_block_bounds_parsing():
    fields = " ".join(str(n) for n in range(3, 53))
    assert environ_block_bounds(f"1 (a) b) {fields}") == (50, 51)
    assert environ_block_bounds("1 (x) S 1 2") is None
    bad = fields.replace(" 50 51 ", " 51 50 ")
    assert environ_block_bounds(f"1 (a) {bad}") is None


def test_scrub_wipes_the_token_from_the_start_up_environment_block():
    secret = "tok-" + os.urandom(8).hex()
    code = (
        "import os, sys\n"
        "from bounded_query.harness.staging.tokens import scrub_process_environment\n"
        "before = open('/proc/self/environ', 'rb').read()\n"
        "n = scrub_process_environment(['GH_TOKEN', 'GITHUB_TOKEN'])\n"
        "after = open('/proc/self/environ', 'rb').read()\n"
        "secret = sys.argv[1].encode()[::-1]\n"
        "print(n, secret in before, secret in after, 'GH_TOKEN' in os.environ,\n"
        "      os.environ.get('KEEP'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, secret[::-1]],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"], "GH_TOKEN": secret, "GITHUB_TOKEN": secret, "KEEP": "yes"},
    )
    assert done.stdout.split() == ["2", "True", "False", "False", "yes"]
