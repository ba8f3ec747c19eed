"""Local rejections of the wrapper's fixed CLI shape (spec 14.8).

Each case runs the wrapper as a real subprocess next to a listening socket that
nobody accepts on; afterwards a non-blocking accept proves the wrapper never
connected. Also: the copied file is self-contained and Python 3.8 syntax.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bounded_query.harness.staging.outputs import install_wrapper_dir
from tests.conftest import require_python38
from tests.wrapper.fakes import (
    ERROR_LINE,
    WRAPPER_FILE,
    Reply,
    http_reply,
    recorded_server,
    run_wrapper,
    silent_listener,
    was_contacted,
    wrapper_commands,
)

BOOLEAN = '{"type":"boolean"}'


def install_copy(tmp_path: Path) -> Path:
    """The wrapper as the harness installs it (with ``bq_protocol/``); its path."""
    wrapper_dir = tmp_path / "bin"
    wrapper_dir.mkdir()
    install_wrapper_dir(wrapper_dir)
    return wrapper_dir / "bounded-query"


@pytest.fixture(params=sorted(wrapper_commands()))
def cmd(request: pytest.FixtureRequest) -> list[str]:
    return wrapper_commands()[request.param]


def assert_rejected_locally(cmd, args, *, script=b"print(1)\n", stdin=None) -> None:
    with silent_listener() as (path, listener):
        outcome = run_wrapper(cmd, args, script=script, socket_path=path, stdin=stdin)
        contacted = was_contacted(listener)
    assert outcome.stdout == ERROR_LINE
    assert outcome.stderr == b""
    assert outcome.returncode == 0
    assert not contacted, "the broker must not be contacted"


BAD_ARGV = {
    "nothing": [],
    "repo-only": ["--repo", "a/b"],
    "schema-only": ["--schema", BOOLEAN],
    "repo-twice": ["--repo", "a/b", "--repo", "a/b"],
    "schema-twice": ["--schema", BOOLEAN, "--schema", BOOLEAN],
    "repo-twice-plus-schema": ["--repo", "a/b", "--repo", "a/b", "--schema", BOOLEAN],
    "unknown-flag": ["--repo", "a/b", "--schema", BOOLEAN, "--verbose"],
    "unknown-flag-with-value": ["--repo", "a/b", "--schema", BOOLEAN, "--timeout", "5"],
    "unknown-flag-in-place": ["--repo", "a/b", "--socket", "/tmp/x"],
    "equals-form-repo": ["--repo=a/b", "--schema", BOOLEAN],
    "equals-form-schema": ["--repo", "a/b", f"--schema={BOOLEAN}"],
    "equals-form-both": ["--repo=a/b", f"--schema={BOOLEAN}"],
    "positional-after": ["--repo", "a/b", "--schema", BOOLEAN, "query.py"],
    "positional-before": ["query.py", "--repo", "a/b", "--schema", BOOLEAN],
    "double-dash": ["--repo", "a/b", "--schema", BOOLEAN, "--"],
    "double-dash-first": ["--", "--repo", "a/b", "--schema", BOOLEAN],
    "short-flags": ["-r", "a/b", "-s", BOOLEAN],
    "single-dash-long": ["-repo", "a/b", "-schema", BOOLEAN],
    "uppercase-flag": ["--REPO", "a/b", "--schema", BOOLEAN],
    "abbreviated-flag": ["--rep", "a/b", "--schema", BOOLEAN],
    "help": ["--help"],
    "flag-as-value": ["--repo", "--schema", BOOLEAN, "a/b"],
    "missing-value": ["--repo", "a/b", "--schema"],
    "empty-repo": ["--repo", "", "--schema", BOOLEAN],
    "repo-without-slash": ["--repo", "octo", "--schema", BOOLEAN],
    "repo-two-slashes": ["--repo", "a/b/c", "--schema", BOOLEAN],
    "repo-empty-owner": ["--repo", "/b", "--schema", BOOLEAN],
    "repo-empty-name": ["--repo", "a/", "--schema", BOOLEAN],
    "repo-with-space": ["--repo", "a/b c", "--schema", BOOLEAN],
    "repo-with-newline": ["--repo", "a/b\n", "--schema", BOOLEAN],
    "repo-header-injection": ["--repo", "a/b\r\nX-AWF-Repo: c/d", "--schema", BOOLEAN],
    "repo-with-tab": ["--repo", "a/\tb", "--schema", BOOLEAN],
    "repo-with-del": ["--repo", "a/b\x7f", "--schema", BOOLEAN],
    "repo-non-ascii": ["--repo", "a/b\u00e9", "--schema", BOOLEAN],
    "repo-141-chars": ["--repo", "a/" + "b" * 139, "--schema", BOOLEAN],
    "empty-schema": ["--repo", "a/b", "--schema", ""],
    "schema-4097-ascii-bytes": ["--repo", "a/b", "--schema", "x" * 4097],
    # 1366 three-byte characters: under 4096 characters, over 4096 bytes.
    "schema-4098-utf8-bytes": ["--repo", "a/b", "--schema", "\u20ac" * 1366],
}


@pytest.mark.parametrize("args", list(BAD_ARGV.values()), ids=list(BAD_ARGV))
def test_bad_argv_is_rejected_locally(cmd, args):
    assert_rejected_locally(cmd, args)


def test_schema_that_is_not_utf8_is_rejected_locally(cmd):
    assert_rejected_locally(cmd, [b"--repo", b"a/b", b"--schema", b'{"type":"\xff"}'])


def test_empty_script_is_rejected_locally(cmd):
    assert_rejected_locally(cmd, ["--repo", "a/b", "--schema", BOOLEAN], script=b"")


def test_script_over_64_kib_is_rejected_locally(cmd):
    args = ["--repo", "a/b", "--schema", BOOLEAN]
    assert_rejected_locally(cmd, args, script=b"#" * (64 * 1024 + 1))


def test_huge_script_is_rejected_locally(cmd):
    args = ["--repo", "a/b", "--schema", BOOLEAN]
    assert_rejected_locally(cmd, args, script=b"#" * (8 * 1024 * 1024))


def test_terminal_on_stdin_is_rejected_locally(cmd):
    leader, follower = os.openpty()
    try:
        assert_rejected_locally(cmd, ["--repo", "a/b", "--schema", BOOLEAN], stdin=follower)
    finally:
        os.close(leader)
        os.close(follower)


def test_closed_stdin_is_rejected_locally(cmd):
    with silent_listener() as (path, listener):
        env = {**os.environ, "AWF_BOUNDED_QUERY_SOCKET": path}
        proc = subprocess.run(
            ["sh", "-c", 'exec "$@" <&-', "sh", *cmd, "--repo", "a/b", "--schema", BOOLEAN],
            capture_output=True,
            env=env,
            timeout=30,
            check=False,
        )
        contacted = was_contacted(listener)
    assert (proc.stdout, proc.stderr, proc.returncode) == (ERROR_LINE, b"", 0)
    assert not contacted


@pytest.mark.parametrize(
    "args",
    [
        ["--repo", "a/b", "--schema", BOOLEAN],
        ["--schema", BOOLEAN, "--repo", "a/b"],
        ["--repo", "a/" + "b" * 138, "--schema", BOOLEAN],  # 140 characters
        ["--repo", "Octo-Org/my.repo_name-2", "--schema", "x" * 4096],
        ["--repo", "a/b", "--schema", "\u20ac" * 1365],  # 4095 bytes
    ],
    ids=["repo-first", "schema-first", "repo-140", "schema-4096", "schema-4095-utf8"],
)
def test_valid_shapes_reach_the_broker(cmd, args):
    """Controls for the rejections above: the boundary cases do get through."""
    reply = http_reply(b'{"status":"ok","result":false}')
    with recorded_server(Reply([reply])) as server:
        outcome = run_wrapper(cmd, args, socket_path=server.path)
    assert outcome.stdout == b'{"status":"ok","result":false}\n'
    assert outcome.stderr == b""
    assert len(server.requests) == 1


# ---------------------------------------------------------------------------
# The file the harness copies is self-contained and Python 3.8 compatible


def test_wrapper_file_parses_as_python_3_8():
    ast.parse(WRAPPER_FILE.read_text(encoding="utf-8"), feature_version=(3, 8))


def test_wrapper_file_imports_only_the_standard_library():
    tree = ast.parse(WRAPPER_FILE.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports in the copied file"
            names.add((node.module or "").split(".")[0])
    names.discard("__future__")
    assert names, "expected some imports"
    assert names <= sys.stdlib_module_names, names - sys.stdlib_module_names


def test_wrapper_file_has_shebang_and_main_guard():
    text = WRAPPER_FILE.read_text(encoding="utf-8")
    # A /bin/sh line that re-runs the file as python3 -I (test_wrapper_isolation.py).
    assert text.startswith('#!/bin/sh\n"""exec" python3 -I "$0" "$@"\n')
    assert 'if __name__ == "__main__":' in text


def test_copied_executable_works_in_isolation(tmp_path):
    """The harness copies the file as ``bounded-query`` next to ``bq_protocol/``;
    run it directly and with -I -S (no site-packages: only the copy can serve)."""
    target = install_copy(tmp_path)
    reply = http_reply(b'{"status":"ok","result":true}')
    with recorded_server(Reply([reply])) as server:
        direct = run_wrapper(
            [str(target)], ["--repo", "a/b", "--schema", BOOLEAN], socket_path=server.path
        )
        isolated = run_wrapper(
            [sys.executable, "-I", "-S", str(target)],
            ["--repo", "a/b", "--schema", BOOLEAN],
            socket_path=server.path,
        )
    for outcome in (direct, isolated):
        assert outcome.stdout == b'{"status":"ok","result":true}\n'
        assert outcome.stderr == b""
        assert outcome.returncode == 0
    assert len(server.requests) == 2
    assert server.requests[0] == server.requests[1]


def test_a_copy_without_its_protocol_package_fails_closed(tmp_path):
    """Control: the limits and the error body come from ``bq_protocol/``; without
    it the copy cannot check anything, so it answers the canonical error and
    never connects."""
    target = tmp_path / "bin" / "bounded-query"
    target.parent.mkdir()
    shutil.copyfile(WRAPPER_FILE, target)
    target.chmod(0o755)
    with silent_listener() as (path, listener):
        outcome = run_wrapper(
            [sys.executable, "-I", "-S", str(target)],
            ["--repo", "a/b", "--schema", BOOLEAN],
            socket_path=path,
        )
        contacted = was_contacted(listener)
    assert (outcome.stdout, outcome.stderr, outcome.returncode) == (ERROR_LINE, b"", 0)
    assert not contacted


def test_the_limits_come_from_the_shipped_protocol_copy(tmp_path):
    """A protocol copy with a smaller schema limit (a stand-in for a future
    protocol) moves the wrapper's local refusal with it: the limit is read,
    not restated."""
    target = install_copy(tmp_path)
    constants = target.parent / "bq_protocol" / "_constants.py"
    constants.chmod(0o644)
    text = constants.read_text(encoding="utf-8")
    assert "MAX_SCHEMA_BYTES = 4096\n" in text
    constants.write_text(text.replace("MAX_SCHEMA_BYTES = 4096\n", "MAX_SCHEMA_BYTES = 20\n"))
    schema_20 = '{"type":"boolean"}  '
    assert len(schema_20) == 20
    reply = http_reply(b'{"status":"ok","result":true}')
    with recorded_server(Reply([reply])) as server:
        fits = run_wrapper(
            [str(target)], ["--repo", "a/b", "--schema", schema_20], socket_path=server.path
        )
    assert fits.stdout == b'{"status":"ok","result":true}\n'
    assert_rejected_locally([str(target)], ["--repo", "a/b", "--schema", schema_20 + " "])


def test_runs_on_a_real_python_3_8(tmp_path):
    """The agent image may only have an old python3; 3.8 is the floor we promise."""
    python38 = require_python38()
    cmd = [python38, str(install_copy(tmp_path))]
    ok = b'{"status":"ok","result":{"tag":"a","value":[1,"\xc3\xa9\\n"]}}'
    with recorded_server(Reply([http_reply(ok)])) as server:
        outcome = run_wrapper(cmd, ["--schema", BOOLEAN, "--repo", "a/b"], socket_path=server.path)
    assert (outcome.stdout, outcome.stderr, outcome.returncode) == (ok + b"\n", b"", 0)
    hostile = http_reply(b'{"status":"ok","result":1.0}')
    with recorded_server(Reply([hostile])) as server:
        outcome = run_wrapper(cmd, ["--schema", BOOLEAN, "--repo", "a/b"], socket_path=server.path)
    assert (outcome.stdout, outcome.stderr, outcome.returncode) == (ERROR_LINE, b"", 0)
    assert_rejected_locally(cmd, ["--repo=a/b", "--schema", BOOLEAN])
