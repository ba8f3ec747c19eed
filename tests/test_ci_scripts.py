"""`make test` provisions nothing: .ci/require-provisioned stops it, naming what is missing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / ".ci" / "require-provisioned"


def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_unreachable_engine_stops_make_test_with_the_fix(tmp_path):
    proc = run({"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("make test: ")
    assert "make provision" in lines[-1]
    assert "make ci" in lines[-1]
    assert not (tmp_path / "no-such.sock").exists()  # nothing was started


def test_missing_tools_are_named(tmp_path):
    """With PATH emptied of ruff and mypy the first missing tool is named."""
    empty = tmp_path / "bin"
    empty.mkdir()
    for tool in ("bash", "env", "dirname"):
        (empty / tool).symlink_to(Path("/usr/bin") / tool)
    proc = run({"PATH": str(empty)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("make test: ruff is not installed")


def test_make_test_checks_before_anything_else():
    """The check is make test's first prerequisite, and make test installs nothing."""
    text = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    rules: dict[str, tuple[list[str], str]] = {}
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if ":" in line and not line.startswith(("\t", "#", " ", ".")) and "=" not in line:
                target, _, after = line.partition(":")
                rules[target] = (after.split(), block)
    prereqs, block = rules["test"]
    assert prereqs[0] == "provisioned"
    assert not {"install", "engine", "images", "test-tools", "provision"} & set(prereqs)
    assert "pip install" not in block
    assert rules["ci"][0] == ["provision"]
    assert {"install", "images", "test-tools"} <= set(rules["provision"][0])
