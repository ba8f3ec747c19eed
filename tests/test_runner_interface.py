"""The broker/sandbox boundary values (broker/runner.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bounded_query.broker.protocol.policy import (
    MAX_MEMORY_BYTES,
    MIN_MEMORY_BYTES,
    parse_memory_limit,
)
from bounded_query.broker.runner import FAILURE_CATEGORIES, Invocation, RunReport


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512m", 512 * 1024**2),
        ("1g", 1024**3),
        ("1G", 1024**3),
        ("6m", MIN_MEMORY_BYTES),
        ("64g", MAX_MEMORY_BYTES),
        ("6291456", MIN_MEMORY_BYTES),
        ("6291456b", MIN_MEMORY_BYTES),
        ("6144k", MIN_MEMORY_BYTES),
    ],
)
def test_memory_limit_accepts_docker_forms(text: str, expected: int) -> None:
    assert parse_memory_limit(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 512m",
        "512m ",
        "512mb",
        "-1m",
        "1.5g",
        "5m",
        "65g",
        "m",
        "\u0661\u0662m",
        "1e3m",
        "0x10m",
    ],
)
def test_memory_limit_rejects_everything_else(text: str) -> None:
    with pytest.raises(ValueError, match="memoryLimit"):
        parse_memory_limit(text)


def test_memory_limit_rejects_non_strings() -> None:
    with pytest.raises(ValueError, match="memoryLimit"):
        parse_memory_limit(512)  # type: ignore[arg-type]


def test_run_report_rejects_unknown_failure_category() -> None:
    with pytest.raises(ValueError, match="unknown runner failure category"):
        RunReport(failure="script said so")
    for category in FAILURE_CATEGORIES:
        assert RunReport(failure=category).failure == category


def test_result_path_is_inside_the_workspace(tmp_path: Path) -> None:
    inv = Invocation("ab" * 8, "cd" * 8, tmp_path / "seed", tmp_path / "work", b"print(1)")
    assert inv.result_path == tmp_path / "work" / "out"
