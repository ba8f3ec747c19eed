"""Per-invocation storage (sandbox/storage.py, issue 9 part 1), with real mounts as root."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from bounded_query.broker.mounts import unmount
from bounded_query.broker.runner import Invocation
from bounded_query.broker.workspace import remove_tree
from bounded_query.sandbox.docker_runner import prepare_workspace, private_storage, release_storage
from bounded_query.sandbox.storage import MIN_BYTES, TmpfsQuota, quota_bytes, tmpfs_quota

MiB = 1024**2
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mount(2) needs root")


def test_quota_is_half_the_memory_limit_and_never_tiny():
    assert quota_bytes(512 * MiB) == 256 * MiB
    assert quota_bytes(6 * MiB) == MIN_BYTES
    quota = tmpfs_quota(256 * MiB)
    assert quota.options == f"size={128 * MiB},nr_inodes={128 * 1024},mode=700"
    with pytest.raises(ValueError, match="too small"):
        TmpfsQuota(MIN_BYTES - 1, 10)


def _invocation(work: Path, name: str) -> Invocation:
    ws = work / name
    ws.mkdir(mode=0o700)
    return Invocation("ab" * 16, name, work / "seed", ws, b"print(1)")


def _first_inodes(inv: Invocation) -> list[int]:
    prepare_workspace(inv, overlay=True)
    names = ("script.py", "out", "upper", "work")
    return [os.stat(inv.workspace / n).st_ino for n in names]


@root_only
def test_every_invocation_starts_with_the_same_figures(tmp_path):
    """What one invocation did never shows in the next one's inode numbers or free space."""
    seen = []
    for i, noise in enumerate((0, 1234, 7)):
        inv = _invocation(tmp_path, f"inv{i}")
        assert private_storage(inv, 64 * MiB)
        try:
            inodes = _first_inodes(inv)
            info = os.statvfs(inv.workspace)
            seen.append((inodes, info.f_bfree, info.f_ffree))
            for n in range(noise):  # what a query might leave behind
                (inv.workspace / "upper" / f"f{n}").write_bytes(b"x" * 100)
        finally:
            assert release_storage(inv)[0]
        assert not inv.workspace.is_mount()
        assert remove_tree(inv.workspace)
    assert seen[0] == seen[1] == seen[2]


@root_only
def test_quota_gives_enospc(tmp_path):
    inv = _invocation(tmp_path, "full")
    assert private_storage(inv, 32 * MiB)  # quota: 16 MiB
    try:
        code = None
        written = 0
        try:
            with open(inv.workspace / "big", "wb") as fh:
                for _ in range(32):
                    fh.write(b"\0" * MiB)
                    fh.flush()
                    written += 1
        except OSError as exc:
            code = exc.errno
        assert code == errno.ENOSPC
        assert written <= 16  # 16 MiB quota
    finally:
        assert release_storage(inv)[0]


@root_only
def test_release_keeps_only_a_valid_answer(tmp_path):
    inv = _invocation(tmp_path, "ans")
    assert private_storage(inv, 32 * MiB)
    prepare_workspace(inv)
    (inv.workspace / "out").write_bytes(b'{"a":1}')
    assert release_storage(inv) == (True, b'{"a":1}')
    assert os.listdir(inv.workspace) == []  # the answer went with the tmpfs


@root_only
def test_release_reads_no_symlinked_answer(tmp_path):
    inv = _invocation(tmp_path, "link")
    assert private_storage(inv, 32 * MiB)
    prepare_workspace(inv)
    secret = tmp_path / "secret"
    secret.write_text('{"a":1}')
    (inv.workspace / "out").unlink()
    (inv.workspace / "out").symlink_to(secret)
    assert release_storage(inv) == (True, None)
    assert os.listdir(inv.workspace) == []


@root_only
def test_a_non_empty_workspace_is_refused(tmp_path):
    inv = _invocation(tmp_path, "busy")
    (inv.workspace / "stale").write_text("x")
    with pytest.raises(OSError, match="not empty"):
        private_storage(inv, 32 * MiB)
    assert not inv.workspace.is_mount()


@root_only
def test_remove_tree_unmounts_a_left_over_workspace(tmp_path):
    """A broker killed mid-invocation leaves the tmpfs mounted; the next start removes it."""
    inv = _invocation(tmp_path, "left")
    assert private_storage(inv, 32 * MiB)
    prepare_workspace(inv, overlay=True)
    (inv.workspace / "upper" / "deep").mkdir()
    assert inv.workspace.is_mount()
    assert remove_tree(inv.workspace)
    assert not inv.workspace.exists()
    assert unmount(tmp_path / "nothing-here") == "absent"
