"""The shipped seccomp profile is exactly what its recipe generates."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "seccomp" / "recipe"


def load_generator():
    spec = importlib.util.spec_from_file_location("seccomp_generate", RECIPE / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_profile_is_regenerated_byte_for_byte(tmp_path):
    gen = load_generator()
    out = tmp_path / "query.json"
    assert gen.main([str(RECIPE / "traced.txt"), str(out)]) == 0
    assert out.read_bytes() == (ROOT / "seccomp" / "query.json").read_bytes()


def test_never_list_wins_over_trace():
    gen = load_generator()
    profile = gen.build({"read", "ptrace", "mount", "unshare", "socket"})
    allowed = set(profile["syscalls"][0]["names"])
    assert "read" in allowed
    assert not allowed & {"ptrace", "mount", "unshare", "socket"}


def test_every_traced_call_is_allowed_unless_never():
    gen = load_generator()
    traced = set((RECIPE / "traced.txt").read_text().split())
    profile = json.loads((ROOT / "seccomp" / "query.json").read_text())
    allowed = set(profile["syscalls"][0]["names"])
    filtered = {n for rule in profile["syscalls"][1:] for n in rule["names"]}
    assert traced - gen.NEVER - gen.CHANNEL_DENY <= allowed
    assert traced & gen.NEVER <= filtered  # clone, clone3, socketpair: argument filters


def test_channel_calls_are_denied_even_when_traced():
    """fadvise64 and sysinfo were traced (coreutils, glibc); they stay denied (issue 9)."""
    gen = load_generator()
    profile = json.loads((ROOT / "seccomp" / "query.json").read_text())
    named = {n for rule in profile["syscalls"] for n in rule["names"]}
    assert {"fadvise64", "mincore", "sysinfo"} <= gen.CHANNEL_DENY
    assert not named & gen.CHANNEL_DENY
    built = set(gen.build({"fadvise64", "sysinfo", "read"})["syscalls"][0]["names"])
    assert "read" in built
    assert not built & gen.CHANNEL_DENY
