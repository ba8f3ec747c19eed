"""Builders for sandbox engine tests: a read-only seed, workspaces, invocations."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
from pathlib import Path

from bounded_query.broker.runner import Invocation, RunnerSettings

IMAGE = "bounded-query-python:latest"
RUNTIMES = ("docker", "gvisor")
GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_AUTHOR_DATE": "1700000000 +0000",
    "GIT_COMMITTER_DATE": "1700000000 +0000",
}


def make_seed(path: Path) -> Path:
    """A small staged-seed look-alike: one packed commit, files 0444, dirs 0555."""
    path.mkdir(parents=True)
    (path / "src").mkdir()
    (path / "README.md").write_text("# fixture\nneedle in a haystack\n")
    for i in range(20):
        (path / "src" / f"mod{i:02d}.py").write_text(f"VALUE = {i}\n" * 50)
    (path / "run.sh").write_text("#!/bin/sh\necho run\n")
    (path / "run.sh").chmod(0o755)

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=path, env=GIT_ENV, check=True, capture_output=True)

    git("-c", "init.templateDir=", "init", "-q", "-b", "main")
    git("add", "-A")
    git("commit", "-q", "-m", "fixture")
    git("gc", "-q", "--prune=now")
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames:
            p = os.path.join(dirpath, name)
            os.chmod(p, stat.S_IMODE(os.lstat(p).st_mode) & ~0o222)
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o555)
    path.chmod(0o555)
    # every ancestor must be traversable by uid 65534 for the gofer/bind mount
    return path


def remove_seed(path: Path) -> None:
    for dirpath, _dirnames, _filenames in os.walk(path):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(path)


def settings(runtime: str, *, timeout_s: int = 30, memory: int = 256 * 1024**2) -> RunnerSettings:
    return RunnerSettings(
        runtime=runtime,
        run_id=secrets.token_hex(16),
        image=IMAGE,
        timeout_s=timeout_s,
        memory_bytes=memory,
    )


def new_invocation(
    settings_: RunnerSettings, work_root: Path, seed: Path, script: str | bytes
) -> Invocation:
    """An invocation whose workspace is created like the broker does (0700)."""
    invocation_id = secrets.token_hex(8)
    workspace = work_root / invocation_id
    workspace.mkdir(mode=0o700, parents=True)
    workspace.chmod(0o700)
    return Invocation(
        run_id=settings_.run_id,
        invocation_id=invocation_id,
        seed_dir=seed,
        workspace=workspace,
        script=script.encode() if isinstance(script, str) else script,
    )


def leftover_containers(client, run_id: str, *, pin: bool = False) -> list[str]:
    """The run's containers; the page-cache pin (alive until reconcile) only with ``pin``."""
    found = client.containers.list(all=True, filters={"label": f"bounded-query.run={run_id}"})
    return [c.name for c in found if pin or c.labels.get("bounded-query.role") != "page-cache-pin"]


def leftover_volumes(client, run_id: str, *, role: str | None = None) -> list[str]:
    found = client.volumes.list(filters={"label": f"bounded-query.run={run_id}"})
    return sorted(
        v.name for v in found if role is None or v.attrs["Labels"].get("bounded-query.role") == role
    )


def image_root() -> Path:
    """Host directory of the query image's (single) layer."""
    out = subprocess.run(
        ["docker", "image", "inspect", IMAGE, "--format", "{{json .GraphDriver.Data}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    data = json.loads(out)
    return Path(data.get("UpperDir") or data["LowerDir"].split(":")[0])


def evict_probe_files(root: Path) -> None:
    """Drop the channel probe files' pages from the host page cache (trusted side)."""
    from tests.sandbox.channels import CACHE_FILES

    for path in CACHE_FILES:
        fd = os.open(root / path.lstrip("/"), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
