"""The installed wrapper and cost tool run an isolated interpreter (spec 14.8; issue 10).

The agent's environment is the agent's: it may hold ``PYTHONWARNINGS=bogus``
(which made the interpreter print a warning before ``main()`` ever ran),
``PYTHONPATH`` pointing at a directory of look-alike modules, a
``sitecustomize``, ``PYTHONINSPECT`` and more. Installed by the harness, both
tools start as ``/bin/sh`` scripts whose line 2 is ``exec python3 -I "$0"
"$@"``. These tests run the files exactly as installed by
``install_wrapper_dir``, as the kernel runs them (and under each shell this
machine has, and under a real Python 3.8), with such an environment, and
check the canonical behaviour: one line on stdout, nothing on stderr, exit 0,
no hostile code run. A control run without ``-I`` shows the environment
really is hostile.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bounded_query.harness.staging.outputs import install_wrapper_dir
from tests.conftest import require_engine, require_python38
from tests.wrapper.fakes import (
    COST_FILE,
    ERROR_LINE,
    WRAPPER_FILE,
    Reply,
    http_reply,
    recorded_server,
    run_wrapper,
)

BOOLEAN = '{"type":"boolean"}'
ARGS = ["--repo", "octo/alpha", "--schema", BOOLEAN]
OK = b'{"status":"ok","result":true}'
POLYGLOT = '#!/bin/sh\n"""exec" python3 -I "$0" "$@"\n'

#: What a sitecustomize, a shadowing module or a startup file does if it runs.
_HOSTILE_CODE = (
    "import os, sys\n"
    "open(os.path.join({where!r}, 'ran-' + {name!r}), 'w').close()\n"
    "sys.stderr.write('hostile {name} ran\\n')\n"
    "sys.stdout.write('hostile {name} ran\\n')\n"
)


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """The wrapper directory as the harness installs it."""
    wrapper_dir = tmp_path / "bin"
    wrapper_dir.mkdir()
    install_wrapper_dir(wrapper_dir)
    return wrapper_dir


def python_dir(python: str = sys.executable) -> str:
    """A PATH entry whose ``python3`` is ``python`` (never a pyenv shim script)."""
    directory = Path(python).parent
    if (directory / "python3").exists() and os.path.samefile(directory / "python3", python):
        return str(directory)
    raise AssertionError(f"no python3 next to {python}")


def hostile_environment(root: Path, python: str = sys.executable) -> dict[str, str]:
    """Variables an agent's environment may hold; each would print or run code."""
    lib = root / "hostile-lib"
    lib.mkdir()
    for name in ("sitecustomize", "json", "socket", "base64"):
        (lib / f"{name}.py").write_text(_HOSTILE_CODE.format(where=str(root), name=name))
    startup = root / "startup.py"
    startup.write_text(_HOSTILE_CODE.format(where=str(root), name="startup"))
    userbase = root / "userbase"
    probe = subprocess.run(
        [python, "-c", "import site; print(site.getusersitepackages())"],
        env={"PYTHONUSERBASE": str(userbase), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    usersite = Path(probe.stdout.strip())
    usersite.mkdir(parents=True)
    (usersite / "usercustomize.py").write_text(
        _HOSTILE_CODE.format(where=str(root), name="usercustomize")
    )
    return {
        "PATH": f"{python_dir(python)}:/usr/bin:/bin",
        "PYTHONWARNINGS": "bogus",
        "PYTHONPATH": str(lib),
        "PYTHONSTARTUP": str(startup),
        "PYTHONINSPECT": "1",
        "PYTHONVERBOSE": "1",
        "PYTHONDEVMODE": "1",
        "PYTHONUSERBASE": str(userbase),
        "PYTHONHOME": str(root / "no-such-home"),
    }


def hostile_code_ran(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("ran-*"))


def assert_clean(outcome: object, stdout: bytes) -> None:
    assert (outcome.stdout, outcome.stderr, outcome.returncode) == (stdout, b"", 0)  # type: ignore[attr-defined]


# --- the file as installed ------------------------------------------------------------


@pytest.mark.parametrize("path", [WRAPPER_FILE, COST_FILE], ids=["wrapper", "cost-tool"])
def test_line_two_is_the_isolated_exec_and_the_docstring_survives(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith(POLYGLOT)
    tree = ast.parse(text)
    # Still the module docstring, so ``from __future__`` stays legal after it.
    docstring = ast.get_docstring(tree, clean=False)
    assert docstring is not None
    assert docstring.startswith('exec" python3 -I "$0" "$@"\n')
    assert isinstance(tree.body[1], ast.ImportFrom)
    assert tree.body[1].module == "__future__"


def test_installed_files_are_the_polyglot_verbatim(installed: Path) -> None:
    for name, source in (("bounded-query", WRAPPER_FILE), ("bounded-query-cost", COST_FILE)):
        target = installed / name
        assert target.read_bytes() == source.read_bytes()
        assert os.access(target, os.X_OK)


def test_installed_wrapper_ignores_a_hostile_python_environment(
    installed: Path, tmp_path: Path
) -> None:
    env = hostile_environment(tmp_path)
    with recorded_server(Reply([http_reply(OK)])) as server:
        hostile = run_wrapper(
            [str(installed / "bounded-query")], ARGS, socket_path=server.path, env=env
        )
        clean = run_wrapper(
            [str(installed / "bounded-query")],
            ARGS,
            socket_path=server.path,
            env={"PATH": env["PATH"]},
        )
    assert_clean(hostile, OK + b"\n")
    assert_clean(clean, OK + b"\n")
    assert hostile_code_ran(tmp_path) == []
    assert len(server.requests) == 2
    assert server.requests[0] == server.requests[1]


def test_installed_wrapper_local_rejection_stays_silent(installed: Path, tmp_path: Path) -> None:
    env = hostile_environment(tmp_path)
    outcome = run_wrapper([str(installed / "bounded-query")], ["--repo=a/b"], env=env)
    assert_clean(outcome, ERROR_LINE)
    assert hostile_code_ran(tmp_path) == []


def test_control_without_isolation_the_environment_is_hostile(
    installed: Path, tmp_path: Path
) -> None:
    """The same environment with a plain ``python3 FILE`` shows what -I prevents."""
    env = hostile_environment(tmp_path)
    del env["PYTHONHOME"]  # without -I it would stop the interpreter before any code ran
    outcome = run_wrapper(
        [sys.executable, str(installed / "bounded-query")], ["--repo=a/b"], env=env
    )
    assert b"Invalid -W option ignored" in outcome.stderr
    assert "ran-sitecustomize" in hostile_code_ran(tmp_path)
    assert outcome.stdout != ERROR_LINE


def _shells() -> list[list[str]]:
    found: list[list[str]] = [["/bin/sh"]]
    for name in ("dash", "bash"):
        path = shutil.which(name)
        if path is not None:
            found.append([path])
    busybox = shutil.which("busybox")
    if busybox is not None:
        found.append([busybox, "sh"])
    return found


@pytest.mark.parametrize("shell", _shells(), ids=lambda shell: " ".join(shell))
def test_polyglot_line_under_each_shell(shell: list[str], installed: Path, tmp_path: Path) -> None:
    env = hostile_environment(tmp_path)
    with recorded_server(Reply([http_reply(OK)])) as server:
        outcome = run_wrapper(
            [*shell, str(installed / "bounded-query")], ARGS, socket_path=server.path, env=env
        )
    assert_clean(outcome, OK + b"\n")
    assert hostile_code_ran(tmp_path) == []


def test_installed_wrapper_on_a_real_python_3_8(installed: Path, tmp_path: Path) -> None:
    """-I exists since 3.4: an agent image whose python3 is 3.8 gets the same behaviour."""
    python38 = require_python38()
    bin_dir = tmp_path / "py38"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(python38)
    env = hostile_environment(tmp_path, python38)
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    with recorded_server(Reply([http_reply(OK)])) as server:
        outcome = run_wrapper(
            [str(installed / "bounded-query")], ARGS, socket_path=server.path, env=env
        )
    assert_clean(outcome, OK + b"\n")
    assert hostile_code_ran(tmp_path) == []


def test_installed_cost_tool_ignores_a_hostile_python_environment(
    installed: Path, tmp_path: Path
) -> None:
    env = hostile_environment(tmp_path)
    outcome = run_wrapper(
        [str(installed / "bounded-query-cost")], ["--json", "--schema", BOOLEAN], env=env
    )
    assert outcome.stderr == b""
    assert outcome.returncode == 0
    report = json.loads(outcome.stdout)
    assert (report["valid"], report["cardinality"], report["chargeBits"]) == (True, "2", 5)
    # Judged by the installed bq_protocol copy: the new rules hold there too.
    deep = '{"type":"array","items":' * 6 + BOOLEAN + ',"length":1}' * 6
    outcome = run_wrapper([str(installed / "bounded-query-cost")], ["--schema", deep], env=env)
    assert (outcome.stderr, outcome.returncode) == (b"", 0)
    assert outcome.stdout.startswith(b"schema: valid\n")
    outcome = run_wrapper(
        [str(installed / "bounded-query-cost")],
        ["--schema", '{"type":"object","fields":{}}'],
        env=env,
    )
    assert (outcome.stderr, outcome.returncode) == (b"", 1)
    assert outcome.stdout == (b"schema: invalid\nreason: schema.fields: must have 1 to 16 fields\n")
    assert hostile_code_ran(tmp_path) == []


# --- in a real container -----------------------------------------------------------------

#: The query image (the compose example's agent service) and the default agent image.
IMAGES = ("bounded-query-python:latest", "bounded-query-agent:latest")
TEST_LABEL = "bounded-query.test"


@pytest.mark.engine
@pytest.mark.parametrize("image", IMAGES)
def test_installed_tools_in_the_debian_images(docker_client, installed: Path, image: str) -> None:
    """Debian's dash and python3 as the agent sees them, with hostile variables."""
    require_engine()
    import docker

    try:
        docker_client.images.get(image)
    except docker.errors.ImageNotFound:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{image} missing under CI=true (make images builds it)")
        pytest.skip(f"{image} not built here (make images)")
    env = {
        "PYTHONWARNINGS": "bogus",
        "PYTHONPATH": "/w/bq_protocol",
        "PYTHONINSPECT": "1",
        "PYTHONVERBOSE": "1",
        "PYTHONHOME": "/nonexistent",
        "PATH": "/usr/bin:/bin",
    }
    commands = {
        "wrapper": ["/w/bounded-query", "--repo", "a/b", "--schema", BOOLEAN],
        "cost": ["/w/bounded-query-cost", "--schema", BOOLEAN],
    }
    results = {}
    for name, command in commands.items():
        container = docker_client.containers.create(
            image,
            command=command,
            entrypoint=[],
            environment=env,
            user="65534:65534",
            network_mode="none",
            read_only=True,
            volumes={str(installed): {"bind": "/w", "mode": "ro"}},
            labels={TEST_LABEL: "wrapper-isolation"},
        )
        try:
            container.start()
            status = container.wait(timeout=60)["StatusCode"]
            out = container.logs(stdout=True, stderr=False)
            err = container.logs(stdout=False, stderr=True)
        finally:
            container.remove(force=True)
        results[name] = (status, out, err)
    # No socket variable: the wrapper's canonical local error, and nothing else.
    assert results["wrapper"] == (0, ERROR_LINE, b"")
    status, out, err = results["cost"]
    assert (status, err) == (0, b"")
    assert out.startswith(b"schema: valid\n")
    assert b"charge: 5 bits" in out
