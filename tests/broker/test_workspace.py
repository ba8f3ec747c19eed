"""Hostile workspaces: result-file reads and teardown (broker/workspace.py, spec 14.7)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bounded_query.broker.workspace import read_result_file, remove_tree


def _deep_tree(root: Path, depth: int) -> None:
    """``root/a/a/...`` ``depth`` levels deep (far beyond PATH_MAX), built by fd."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("a", dir_fd=fd)
            child = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        leaf = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.close(leaf)
    finally:
        os.close(fd)


def test_tree_nested_thousands_deep_is_removed(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    _deep_tree(workspace, 3000)  # shutil.rmtree recursed and raised RecursionError
    assert remove_tree(workspace) is True
    assert not workspace.exists()


def test_hostile_names_links_and_special_files(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("secret")
    workspace = tmp_path / "ws"
    upper = workspace / "upper" / "dir\nwith\nnewlines"
    upper.mkdir(parents=True)
    (upper / "name\nwith newline").write_text("x")
    (upper / "-rf").write_text("x")
    os.symlink(outside, upper / "link-to-outside-dir")
    os.symlink(outside / "keep", upper / "link-to-outside-file")
    os.symlink("/", upper / "link-to-root")
    os.link(outside / "keep", upper / "hardlink-to-outside")
    os.mkfifo(upper / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(os.fspath(upper / "sock"))
    readonly = workspace / "ro"
    (readonly / "inner").mkdir(parents=True)
    (readonly / "inner" / "f").write_text("x")
    os.chmod(readonly / "inner", 0o500)
    os.chmod(readonly, 0o000)
    assert remove_tree(workspace) is True
    assert not os.path.lexists(workspace)
    assert (outside / "keep").read_text() == "secret"
    assert sorted(os.listdir(outside)) == ["keep"]


def test_a_workspace_that_is_a_symlink_is_unlinked_not_followed(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp_path / "ws"
    os.symlink(target, link)
    assert remove_tree(link) is True
    assert (target / "keep").exists()


def test_missing_workspace_counts_as_removed(tmp_path):
    assert remove_tree(tmp_path / "never-created") is True


def test_read_only_tree_is_removed_without_privileges(tmp_path):
    """As an unprivileged owner (no CAP_DAC_OVERRIDE), chmod'ed-away trees still go."""
    workspace = tmp_path / "ws"
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from bounded_query.broker.workspace import remove_tree\n"
        "ws = Path(sys.argv[1])\n"
        "(ws / 'a' / 'b').mkdir(parents=True)\n"
        "(ws / 'a' / 'b' / 'f').write_text('x')\n"
        "os.chmod(ws / 'a' / 'b', 0o000)\n"
        "os.chmod(ws / 'a', 0o500)\n"
        "print(remove_tree(ws), os.path.lexists(ws))\n"
    )
    workspace.mkdir(mode=0o700)
    # Root keeps its uid (so the interpreter stays importable) but loses every
    # capability, CAP_DAC_OVERRIDE and CAP_FOWNER included.
    command = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--"]
    done = subprocess.run(
        [*command, sys.executable, "-c", script, str(workspace)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.stdout.split() == ["True", "False"], done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_mount_point_inside_a_workspace_is_never_emptied(tmp_path):
    workspace = tmp_path / "ws"
    mnt = workspace / "mnt"
    mnt.mkdir(parents=True)
    (workspace / "plain").write_text("x")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt)], check=False)
    if mounted.returncode != 0:
        pytest.skip("this machine does not allow tmpfs mounts")
    try:
        (mnt / "other-fs").write_text("keep")
        assert remove_tree(workspace) is False
        assert (mnt / "other-fs").read_text() == "keep"
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    assert remove_tree(workspace) is True


@pytest.mark.parametrize("kind", ["symlink", "fifo", "dir", "socket", "missing", "big"])
def test_result_file_must_be_a_small_regular_file(tmp_path, kind):
    secret = tmp_path / "secret"
    secret.write_text("true")
    out = tmp_path / "out"
    if kind == "symlink":
        os.symlink(secret, out)
    elif kind == "fifo":
        os.mkfifo(out)  # opening must not block
    elif kind == "dir":
        out.mkdir()
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(os.fspath(out))
    elif kind == "big":
        out.write_bytes(b" " * 8192 + b"1")
    assert read_result_file(out) is None


def test_result_file_at_the_cap_is_read(tmp_path):
    out = tmp_path / "out"
    out.write_bytes(b" " * 8191 + b"1")
    assert read_result_file(out) == b" " * 8191 + b"1"
