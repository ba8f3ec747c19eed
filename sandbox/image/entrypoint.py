"""Fixed entrypoint of the query image (spec 14.7; docs/architecture.md decisions 2 and 3).

Theory of operation: the container starts as uid/gid 65534 with a read-only
root, the trusted seed bound read-only at ``/awf/seed``, the query script bound
read-only at ``/awf/query-script.py``, a size-limited tmpfs at ``/query`` and
the pre-created result file bound at ``/query/out``. This program (the only
command the image runs; it is baked into the image and never comes from a
request) materializes a private, fully writable copy of the seed at
``/query/repo`` and then runs the script as ``__main__`` with cwd ``/query``.

Materialization: when the runner has already mounted a private copy-on-write
view of the seed at ``/query/repo`` (its default, see sandbox/overlay.py),
there is nothing to do. Otherwise ("git") the seed is a clean checkout whose
objects sit in packs. Copying its work tree file by file is the expensive
part, especially under gVisor where every file opened on a bind mount is a
round trip to the gofer. Instead we copy only the small metadata of ``.git``
(refs, HEAD, config, shallow, ...), borrow the seed's object store through
``objects/info/alternates`` (read-only; new objects land in the private
``.git/objects``), and let git write the work tree and a fresh index from the
pack (``git reset --hard``, parallel checkout). The files git writes belong to
the query user with ordinary modes, so the tree is fully writable. A seed
without ``.git`` falls back to a plain copy ("copy"), which also serves as
the baseline for the benchmark.

Exit status: the script's own status; ``MATERIALIZE_FAILED`` when the seed
could not be materialized; 128+N when the script died from signal N.
Everything here must stay standard-library only (the image has no packages
beyond python3 and git).
"""

from __future__ import annotations

import os
import resource
import shutil
import stat
import subprocess
import sys
import time

SEED = "/awf/seed"
QUERY = "/query"
REPO = "/query/repo"
SCRIPT = "/awf/query-script.py"

#: Exit status when the seed cannot be materialized (EX_SOFTWARE).
MATERIALIZE_FAILED = 70
#: Per-file size limit for the script itself: far above the 8 KiB result cap,
#: and low enough that the host-backed result file cannot fill the host disk
#: (the container's own RLIMIT_FSIZE must stay large enough for the seed).
SCRIPT_FSIZE_BYTES = 64 * 1024 * 1024
#: Git's own configuration for our calls: the seed is owned by another uid.
GIT_ENV_EXTRA = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
    "GIT_CONFIG_KEY_1": "checkout.workers",
    "GIT_CONFIG_VALUE_1": "0",
}


def _copy_git_metadata(src: str, dst: str) -> None:
    """Copy ``src`` (a ``.git`` dir) to ``dst`` except objects and the index."""
    os.mkdir(dst, 0o755)
    for entry in os.scandir(src):
        if entry.name in ("objects", "index"):
            continue
        target = os.path.join(dst, entry.name)
        if entry.is_symlink():
            continue  # a scrubbed seed has none; never follow one
        if entry.is_dir():
            _copy_git_metadata(entry.path, target)
        elif entry.is_file():
            shutil.copyfile(entry.path, target)
            os.chmod(target, 0o644)


def materialize_git() -> None:
    """Create /query/repo from the seed's packs (see module docstring)."""
    seed_git = os.path.join(SEED, ".git")
    repo_git = os.path.join(REPO, ".git")
    os.mkdir(REPO, 0o755)
    _copy_git_metadata(seed_git, repo_git)
    objects = os.path.join(repo_git, "objects")
    os.makedirs(os.path.join(objects, "info"), 0o755)
    os.makedirs(os.path.join(objects, "pack"), 0o755)
    with open(os.path.join(objects, "info", "alternates"), "w", encoding="utf-8") as fh:
        fh.write(os.path.join(seed_git, "objects") + "\n")
    env = dict(os.environ, **GIT_ENV_EXTRA)
    subprocess.run(
        ["git", "reset", "-q", "--hard", "HEAD"],
        cwd=REPO,
        env=env,
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )


def materialize_copy() -> None:
    """Copy the seed file by file, then give the query user write access."""
    subprocess.run(["cp", "-a", SEED, REPO], check=True, stdin=subprocess.DEVNULL)
    for dirpath, _dirnames, filenames in os.walk(REPO):
        os.chmod(dirpath, stat.S_IMODE(os.lstat(dirpath).st_mode) | 0o700)
        for name in filenames:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                os.chmod(path, stat.S_IMODE(mode) | 0o600)


def main(argv: list[str]) -> int:
    """Materialize the seed, run the script; return the exit status."""
    method = "git"
    timings = False
    for arg in argv:
        if arg == "--timings":
            timings = True
        elif arg.startswith("--materialize="):
            method = arg.partition("=")[2]
    if os.path.isdir(REPO):
        method = "mounted"  # the runner mounted a copy-on-write view (sandbox/overlay.py)
    elif method == "git" and not os.path.isdir(os.path.join(SEED, ".git")):
        method = "copy"
    started = time.monotonic()
    try:
        if method == "git":
            materialize_git()
        elif method == "copy":
            materialize_copy()
        elif method == "mounted":
            pass
        else:
            return MATERIALIZE_FAILED
    except (OSError, subprocess.CalledProcessError):
        return MATERIALIZE_FAILED
    materialized = time.monotonic()
    _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    limit = SCRIPT_FSIZE_BYTES if hard == resource.RLIM_INFINITY else min(hard, SCRIPT_FSIZE_BYTES)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    os.chdir(QUERY)
    status = subprocess.call(["python3", SCRIPT], stdin=subprocess.DEVNULL, close_fds=True)
    finished = time.monotonic()
    if timings:
        materialize, run = materialized - started, finished - materialized
        sys.stderr.write(f"awf-timing materialize={materialize:.6f} run={run:.6f}\n")
        sys.stderr.flush()
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
