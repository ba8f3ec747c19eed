"""``bounded-agent`` from the caller's side (spec 15.8): the installed file as the
harness lays it out (``install_agent_wrapper_dir``), run as a real process
against a fake agent broker whose every request must pass the strict frame
reader (``tests/wrapper/agent_frame.py``).

Checked: the frame and the canonical pass-through; the same local refusals as
``bounded-query`` (argv shape, schema, repository) plus the task's (empty,
not UTF-8, over the run's ``maxTaskBytes`` from ``bounded-agent.json``, over
the spec's bound without one); the broker is never contacted for any of them;
a malformed limits file fails closed; the two programs never cross sockets;
the console script; a hostile Python environment; a real Python 3.8.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bounded_query.broker.protocol import policy
from bounded_query.harness.staging.outputs import install_agent_wrapper_dir
from bounded_query.wrapper import bounded_query_cli as cli
from tests.conftest import require_engine, require_python38
from tests.wrapper.agent_frame import FrameError, parse_agent_frame
from tests.wrapper.fakes import (
    ERROR_LINE,
    Reply,
    console_script,
    http_reply,
    recorded_server,
    silent_listener,
    split_request,
    was_contacted,
)
from tests.wrapper.test_wrapper_cli import BAD_ARGV
from tests.wrapper.test_wrapper_isolation import hostile_code_ran, hostile_environment

AGENT_SOCKET = policy.ENV_AGENT_SOCKET
QUERY_SOCKET = policy.ENV_SOCKET
BOOLEAN = '{"type":"boolean"}'
ARGS = ["--repo", "octo/alpha", "--schema", BOOLEAN]
OK = b'{"status":"ok","result":true}'
TASK = "Does the retry loop in src/net give up after a timeout?\nAnswer \u00e9 true/false.\n"
#: The run's maxTaskBytes in these tests (small, so the edge is cheap to probe).
LIMIT = 100


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """The agent ingress's wrapper directory exactly as the harness installs it."""
    wrapper_dir = tmp_path / "bin"
    wrapper_dir.mkdir()
    install_agent_wrapper_dir(wrapper_dir, LIMIT)
    return wrapper_dir


def agent(installed: Path) -> list[str]:
    """Run as the kernel does: the /bin/sh line re-executes ``python3 -I``."""
    return [str(installed / "bounded-agent")]


def env_for(socket_path: str | None, *, query_socket: str | None = None) -> dict[str, str]:
    """The caller's environment; a short (test-only) deadline, so a wrapper that
    wrongly connects to a listener nobody serves fails the test in seconds."""
    env = {k: v for k, v in os.environ.items() if k not in (AGENT_SOCKET, QUERY_SOCKET)}
    env[cli.TEST_DEADLINE_ENV] = "5"
    if socket_path is not None:
        env[AGENT_SOCKET] = socket_path
    if query_socket is not None:
        env[QUERY_SOCKET] = query_socket
    return env


def run_cli(
    command: Sequence[str], args: Sequence[str | bytes], env: dict[str, str], **kwargs: Any
) -> subprocess.CompletedProcess[bytes]:
    """Run the CLI once as a real process; stdout and stderr captured."""
    return subprocess.run(
        [*command, *args], capture_output=True, env=env, timeout=60, check=False, **kwargs
    )


def ask(command: list[str], args: Sequence[str | bytes], task: bytes, socket_path: str) -> bytes:
    """Run once against ``socket_path``; assert the contract; return stdout."""
    proc = run_cli(command, args, env_for(socket_path), input=task)
    assert (proc.stderr, proc.returncode) == (b"", 0)
    return proc.stdout


def assert_refused_locally(
    command: list[str], args: Sequence[str | bytes], task: bytes | None, *, stdin: int | None = None
) -> None:
    with silent_listener() as (path, listener):
        proc = run_cli(
            command, args, env_for(path), input=task if stdin is None else None, stdin=stdin
        )
        contacted = was_contacted(listener)
    assert (proc.stdout, proc.stderr, proc.returncode) == (ERROR_LINE, b"", 0)
    assert not contacted, "the agent broker must not be contacted"


# --- the frame --------------------------------------------------------------------------


def test_the_agent_frame_carries_the_task_verbatim(installed: Path) -> None:
    task = TASK.encode()
    with recorded_server(Reply([http_reply(OK)])) as server:
        out = ask(agent(installed), ARGS, task, server.path)
    assert out == OK + b"\n"
    assert len(server.requests) == 1
    frame = parse_agent_frame(server.requests[0], LIMIT)
    assert (frame.repo, frame.schema, frame.task) == ("octo/alpha", BOOLEAN.encode(), task)
    # And the fake really is strict: the query frame of the same question fails it.
    with pytest.raises(FrameError, match="not part of the frame"):
        parse_agent_frame(cli.build_request("octo/alpha", BOOLEAN.encode(), task), LIMIT)


def test_the_frame_is_the_one_build_agent_request_documents(installed: Path) -> None:
    schema = '{"type":"enum","values":["auth","session","\u00e9"]}'
    with recorded_server(Reply([http_reply(OK)])) as server:
        ask(
            agent(installed),
            ["--schema", schema, "--repo", "Octo-Org/my.repo_2"],
            b"x",
            server.path,
        )
    expected = cli.build_agent_request("Octo-Org/my.repo_2", schema.encode(), b"x")
    assert server.requests == [expected]
    _line, headers, _body = split_request(expected)
    names = [name.lower() for name, _ in headers]
    assert names.count(b"x-awf-agent-version") == 1
    assert b"x-awf-query-version" not in names


def test_a_task_cannot_smuggle_headers_or_a_second_request(installed: Path) -> None:
    """Header lines, a blank line and a whole second request inside the task
    stay the body of the one framed request (Content-Length, Connection: close)."""
    task = b"t\r\nX-AWF-Image: evil\r\n\r\nPOST /query HTTP/1.1\r\nContent-Length: 1\r\n\r\nx"
    assert len(task) <= LIMIT
    with recorded_server(Reply([http_reply(OK)])) as server:
        assert ask(agent(installed), ARGS, task, server.path) == OK + b"\n"
    assert len(server.requests) == 1
    frame = parse_agent_frame(server.requests[0], LIMIT)
    assert frame.task == task


@pytest.mark.parametrize(
    "body",
    [
        b'{"status":"ok","result":{"tag":"found","value":"api-key"}}',
        b'{"status":"ok","result":[1,"\xc3\xa9\\n",null]}',
        b'{"status":"error"}',
    ],
)
def test_canonical_answers_pass_through_byte_for_byte(installed: Path, body: bytes) -> None:
    with recorded_server(Reply([http_reply(body)])) as server:
        assert ask(agent(installed), ARGS, b"task", server.path) == body + b"\n"


@pytest.mark.parametrize(
    "reply",
    [
        http_reply(b'{"status":"ok","result":1.0}'),
        http_reply(b'{"status":"ok","result":true,"why":"x"}'),
        http_reply(b'{"status":"error"}', status=b"500 Internal Server Error"),
        http_reply(OK)[:-3],
        b"",
    ],
    ids=["float", "extra-key", "500", "truncated", "closed"],
)
def test_anything_else_from_the_broker_is_the_canonical_error(
    installed: Path, reply: bytes
) -> None:
    with recorded_server(Reply([reply])) as server:
        assert ask(agent(installed), ARGS, b"task", server.path) == ERROR_LINE
        assert len(server.requests) == 1


# --- the two programs never cross ------------------------------------------------------


def test_bounded_agent_uses_only_the_agent_socket(installed: Path) -> None:
    """With only the query socket set, the agent program answers the canonical
    error without connecting to it (a task must never reach the query broker)."""
    with silent_listener() as (query_path, listener):
        proc = run_cli(
            agent(installed), ARGS, env_for(None, query_socket=query_path), input=b"task"
        )
        contacted = was_contacted(listener)
    assert (proc.stdout, proc.stderr, proc.returncode) == (ERROR_LINE, b"", 0)
    assert not contacted


def test_the_same_file_as_bounded_query_sends_the_query_frame(installed: Path) -> None:
    """One file, two programs: under the name ``bounded-query`` (copied from the
    agent directory, so with the same protocol copy) it frames a v2 query to
    the query socket and ignores the agent socket."""
    query_copy = installed.parent / "query-bin"
    shutil.copytree(installed, query_copy, symlinks=True)
    os.rename(query_copy / "bounded-agent", query_copy / "bounded-query")
    with recorded_server(Reply([http_reply(OK)])) as server, silent_listener() as (path, lst):
        proc = subprocess.run(
            [str(query_copy / "bounded-query"), *ARGS],
            input=b"print(1)\n",
            capture_output=True,
            env=env_for(path, query_socket=server.path),
            timeout=60,
            check=False,
        )
        contacted = was_contacted(lst)
    assert (proc.stdout, proc.stderr, proc.returncode) == (OK + b"\n", b"", 0)
    assert server.requests == [cli.build_request("octo/alpha", BOOLEAN.encode(), b"print(1)\n")]
    assert not contacted


@pytest.mark.parametrize(
    ("argv0", "program"),
    [
        ("/w/bounded-agent", cli.AGENT_PROGRAM),
        ("bounded-agent", cli.AGENT_PROGRAM),
        ("/w/bounded-query", cli.QUERY_PROGRAM),
        ("/src/wrapper/bounded_query_cli.py", cli.QUERY_PROGRAM),
        ("/w/bounded-agent.py", cli.QUERY_PROGRAM),
        ("/w/bounded-agent/x", cli.QUERY_PROGRAM),
        ("", cli.QUERY_PROGRAM),
    ],
)
def test_the_program_is_chosen_by_the_exact_name(argv0: str, program: str) -> None:
    assert cli.program_for(argv0) == program


# --- local refusals ----------------------------------------------------------------------


@pytest.mark.parametrize("args", list(BAD_ARGV.values()), ids=list(BAD_ARGV))
def test_bad_argv_is_refused_locally(installed: Path, args: list[str]) -> None:
    assert_refused_locally(agent(installed), args, b"task")


def test_a_schema_that_is_not_utf8_is_refused_locally(installed: Path) -> None:
    args: Sequence[str | bytes] = [b"--repo", b"a/b", b"--schema", b'{"type":"\xff"}']
    assert_refused_locally(agent(installed), args, b"task")


@pytest.mark.parametrize(
    "task",
    [b"", b"\xff", b"caf\xc3", b"\xed\xa0\x80", b"x" * (LIMIT + 1), b"x" * (8 * 1024 * 1024)],
    ids=["empty", "invalid-byte", "truncated-utf8", "surrogate", "limit+1", "8-MiB"],
)
def test_a_bad_task_is_refused_locally(installed: Path, task: bytes) -> None:
    assert_refused_locally(agent(installed), ARGS, task)


def test_a_task_at_the_limit_is_sent(installed: Path) -> None:
    """Control for the refusals: exactly ``maxTaskBytes`` bytes (multi-byte
    characters included) reach the broker unchanged."""
    task = ("\u20ac" * 33 + "x").encode()
    assert len(task) == LIMIT
    with recorded_server(Reply([http_reply(OK)])) as server:
        assert ask(agent(installed), ARGS, task, server.path) == OK + b"\n"
    assert parse_agent_frame(server.requests[0], LIMIT).task == task


def test_a_terminal_or_closed_stdin_is_refused_locally(installed: Path) -> None:
    leader, follower = os.openpty()
    try:
        assert_refused_locally(agent(installed), ARGS, None, stdin=follower)
    finally:
        os.close(leader)
        os.close(follower)
    with silent_listener() as (path, listener):
        proc = subprocess.run(
            ["sh", "-c", 'exec "$@" <&-', "sh", *agent(installed), *ARGS],
            capture_output=True,
            env=env_for(path),
            timeout=60,
            check=False,
        )
        contacted = was_contacted(listener)
    assert (proc.stdout, proc.stderr, proc.returncode) == (ERROR_LINE, b"", 0)
    assert not contacted


def test_no_agent_socket_is_the_canonical_error(installed: Path) -> None:
    proc = run_cli(agent(installed), ARGS, env_for(None), input=b"task")
    assert (proc.stdout, proc.stderr, proc.returncode) == (ERROR_LINE, b"", 0)


# --- where the limit comes from -----------------------------------------------------------


def test_the_harness_writes_the_runs_limit_next_to_the_program(installed: Path) -> None:
    data = (installed / cli.AGENT_LIMITS_FILE).read_bytes()
    assert data == b'{"version":1,"maxTaskBytes":100}\n'
    assert cli.decode_agent_limits(data, policy.ENCLAVE_MAX_TASK_BYTES) == LIMIT
    assert (installed / cli.AGENT_LIMITS_FILE).stat().st_mode & 0o777 == 0o444


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{",
        b'{"version":1}',
        b'{"version":2,"maxTaskBytes":100}',
        b'{"version":1,"maxTaskBytes":0}',
        b'{"version":1,"maxTaskBytes":100.0}',
        b'{"version":1,"maxTaskBytes":true}',
        b'{"version":1,"maxTaskBytes":65537}',
        b'{"version":1,"maxTaskBytes":100,"extra":1}',
        b"[1,100]",
        b" " * 5000,
    ],
)
def test_a_malformed_limits_file_fails_closed(installed: Path, content: bytes) -> None:
    """The harness wrote it; anything else means a broken or tampered install:
    the canonical error, and the broker is never contacted, even for a task
    that any limit would allow."""
    limits = installed / cli.AGENT_LIMITS_FILE
    limits.unlink()
    limits.write_bytes(content)
    assert_refused_locally(agent(installed), ARGS, b"task")


def test_a_limits_symlink_is_not_followed(installed: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "bigger.json"
    elsewhere.write_bytes(cli.encode_agent_limits(1000))
    limits = installed / cli.AGENT_LIMITS_FILE
    limits.unlink()
    limits.symlink_to(elsewhere)
    assert_refused_locally(agent(installed), ARGS, b"task")


def test_a_limits_fifo_or_directory_fails_closed_without_blocking(installed: Path) -> None:
    limits = installed / cli.AGENT_LIMITS_FILE
    limits.unlink()
    os.mkfifo(limits)
    assert_refused_locally(agent(installed), ARGS, b"task")
    limits.unlink()
    limits.mkdir()
    assert_refused_locally(agent(installed), ARGS, b"task")


@pytest.mark.parametrize(
    "fact", ["ENCLAVE_MAX_TASK_BYTES", "AGENT_PROTOCOL_VERSION", "ENV_AGENT_SOCKET"]
)
def test_a_protocol_copy_without_a_fact_fails_closed(installed: Path, fact: str) -> None:
    """The facts are read, never guessed: a ``bq_protocol`` copy that lacks one
    (an older or damaged copy) makes the program answer the canonical error."""
    policy_file = installed / "bq_protocol" / "policy.py"
    policy_file.chmod(0o644)
    text = policy_file.read_text(encoding="utf-8")
    assert f"\n{fact} = " in text
    policy_file.write_text(text.replace(f"\n{fact} = ", f"\n_GONE_{fact} = "), encoding="utf-8")
    assert_refused_locally(agent(installed), ARGS, b"task")


def test_an_unknown_program_is_the_canonical_error() -> None:
    assert cli.run(ARGS, None, {}, "bounded-other") == cli.CANONICAL_ERROR


def test_without_a_limits_file_the_specs_bound_applies(installed: Path) -> None:
    """A copy with no ``bounded-agent.json`` (or the console script) refuses only
    what no run could accept (65536 bytes, spec 15.2); the broker judges the rest."""
    (installed / cli.AGENT_LIMITS_FILE).unlink()
    bound = policy.ENCLAVE_MAX_TASK_BYTES
    with recorded_server(Reply([http_reply(OK)])) as server:
        assert ask(agent(installed), ARGS, b"x" * bound, server.path) == OK + b"\n"
    assert parse_agent_frame(server.requests[0], bound).task == b"x" * bound
    assert_refused_locally(agent(installed), ARGS, b"x" * (bound + 1))


def test_the_limits_codec_round_trips_and_refuses() -> None:
    upper = policy.ENCLAVE_MAX_TASK_BYTES
    for value in (1, 4096, upper):
        assert cli.decode_agent_limits(cli.encode_agent_limits(value), upper) == value
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="maxTaskBytes"):
            cli.encode_agent_limits(bad)  # type: ignore[arg-type]
    with pytest.raises(cli.InstallationError):
        cli.decode_agent_limits(cli.encode_agent_limits(upper + 1), upper)


# --- other ways to run it ----------------------------------------------------------------


def test_the_console_script_speaks_the_agent_frame() -> None:
    command = [console_script("bounded-agent")]
    with recorded_server(Reply([http_reply(OK)])) as server:
        assert ask(command, ARGS, TASK.encode(), server.path) == OK + b"\n"
    frame = parse_agent_frame(server.requests[0], policy.ENCLAVE_MAX_TASK_BYTES)
    assert frame.task == TASK.encode()
    assert_refused_locally(command, ["--repo=a/b", "--schema", BOOLEAN], b"task")


def test_a_hostile_python_environment_changes_nothing(installed: Path, tmp_path: Path) -> None:
    env = hostile_environment(tmp_path)
    with recorded_server(Reply([http_reply(OK)])) as server:
        env[AGENT_SOCKET] = server.path
        proc = run_cli(agent(installed), ARGS, env, input=b"task")
    assert (proc.stdout, proc.stderr, proc.returncode) == (OK + b"\n", b"", 0)
    assert hostile_code_ran(tmp_path) == []
    assert parse_agent_frame(server.requests[0], LIMIT).task == b"task"


def test_runs_on_a_real_python_3_8(installed: Path, tmp_path: Path) -> None:
    """The floor the wrapper promises: the installed copy, its ``bq_protocol``
    facts and its limits file, under a real 3.8 as ``python3``."""
    python38 = require_python38()
    bin_dir = tmp_path / "py38"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(python38)
    env = env_for(None)
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    with recorded_server(Reply([http_reply(OK)])) as server:
        env[AGENT_SOCKET] = server.path
        proc = run_cli(agent(installed), ARGS, env, input=TASK.encode())
    assert (proc.stdout, proc.stderr, proc.returncode) == (OK + b"\n", b"", 0)
    assert parse_agent_frame(server.requests[0], LIMIT).task == TASK.encode()
    direct = [python38, str(installed / "bounded-agent")]
    assert_refused_locally(direct, ARGS, b"x" * (LIMIT + 1))
    assert_refused_locally(direct, ARGS, b"\xff")


# --- in a real container -----------------------------------------------------------------

#: The default agent image (Debian's dash and python3, as the agent has them).
AGENT_IMAGE = "bounded-query-agent:latest"
TEST_LABEL = "bounded-query.test"


@pytest.mark.engine
def test_bounded_agent_in_the_agent_image(docker_client: Any, installed: Path) -> None:
    """The installed directory read-only in the agent image, as uid 65534 with
    hostile ``PYTHON*`` variables: an oversize task is refused without a
    connection, a good one reaches the fake agent broker (its socket in a
    bind-mounted directory) as a strict frame, and the answer comes back as
    the one canonical line."""
    require_engine()
    import docker

    try:
        docker_client.images.get(AGENT_IMAGE)
    except docker.errors.ImageNotFound:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{AGENT_IMAGE} missing under CI=true (make images builds it)")
        pytest.skip(f"{AGENT_IMAGE} not built here (make images)")
    env = {
        "PYTHONWARNINGS": "bogus",
        "PYTHONPATH": "/w/bq_protocol",
        "PYTHONINSPECT": "1",
        "PYTHONHOME": "/nonexistent",
        "PATH": "/usr/bin:/bin",
        AGENT_SOCKET: "/s/broker.sock",
    }
    script = (
        "printf 'x%.0s' $(seq 101) | /w/bounded-agent --repo octo/alpha --schema "
        + shlex.quote(BOOLEAN)
        + "; printf %s "
        + shlex.quote(TASK)
        + " | /w/bounded-agent --repo octo/alpha --schema "
        + shlex.quote(BOOLEAN)
    )
    with recorded_server(Reply([http_reply(OK)])) as server:
        directory = os.path.dirname(server.path)
        os.chmod(directory, 0o755)
        os.chmod(server.path, 0o777)
        container = docker_client.containers.create(
            AGENT_IMAGE,
            command=["sh", "-c", script],
            entrypoint=[],
            environment=env,
            user="65534:65534",
            network_mode="none",
            read_only=True,
            volumes={
                str(installed): {"bind": "/w", "mode": "ro"},
                directory: {"bind": "/s", "mode": "rw"},
            },
            labels={TEST_LABEL: "agent-wrapper"},
        )
        try:
            container.start()
            status = container.wait(timeout=60)["StatusCode"]
            out = container.logs(stdout=True, stderr=False)
            err = container.logs(stdout=False, stderr=True)
        finally:
            container.remove(force=True)
    assert (status, out, err) == (0, ERROR_LINE + OK + b"\n", b"")
    assert len(server.requests) == 1, "the oversize task must not connect"
    frame = parse_agent_frame(server.requests[0], LIMIT)
    assert (frame.repo, frame.schema, frame.task) == ("octo/alpha", BOOLEAN.encode(), TASK.encode())
