"""Offline staging of seeds (spec 14.6).

Theory of operation, per repository, all before any broker or container
exists:

1. the credential comes from GH_TOKEN/GITHUB_TOKEN and reaches git only
   through the environment of the clone child, read back by a GIT_ASKPASS
   helper script that contains no secret and answers only git's prompts for
   the configured server's origin (any other prompt gets nothing); the URL,
   argv, logs and every file stay credential-free, and errors are scrubbed
   of it all the same. The server must be ``https://`` unless the operator
   explicitly allows plain http (``--allow-insecure-server-url``, for local
   test servers);
2. ``git clone`` runs with an isolated HOME, no system or global config, no
   credential helpers and a protocol allow-list, into
   ``<private root>/seeds/<random 128-bit hex>/``; an operator-provided
   ``--seed-source owner/repo=PATH`` (a local repository or bundle, for
   air-gapped use and demos) is cloned with ``--no-local`` instead -- never
   reachable from a request;
3. the checked-out commit is recorded;
4. the seed is scrubbed: remotes and remote-tracking refs, credential
   helpers (the whole ``.git/config`` is replaced by a minimal one, and
   ``config.worktree`` and the legacy ``remotes/``/``branches/`` go), hooks,
   alternates, worktree links, reflogs, FETCH_HEAD/ORIG_HEAD;
5. submodules (``.gitmodules``, ``.git/modules``), a symlinked ``.git`` and a
   gitdir pointer file are rejected;
6. every write bit is stripped (directories 0555, files 0444, executables
   0555) and the result verified -- statically, and, when running as root,
   for real by ``find`` running as the query uid 65534 through the private
   root, so a seed the query cannot read fails here rather than in every
   query (the reference left the seed root 0500);
7. the askpass helper and the staging HOME are deleted, whatever happened.

Any failure raises :class:`StagingError` and the run aborts (exit 2).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bounded_query.broker.protocol.policy import QUERY_UID
from bounded_query.harness.configuration.config import PrivateRepo
from bounded_query.harness.lifecycle.paths import (
    PRIVATE_ROOT_MODE,
    PRIVATE_ROOT_MODE_ROOT,
    RunPaths,
)

__all__ = [
    "SeedSpec",
    "StagedSeed",
    "StagingError",
    "askpass_script",
    "create_private_root",
    "make_read_only",
    "reject_external_references",
    "remove_read_only_tree",
    "scrub",
    "server_url",
    "stage_seeds",
    "verify_seed",
]

#: Environment variable through which the clone child gets the credential.
CREDENTIAL_VARIABLE = "BQ_STAGING_CREDENTIAL"
#: A clone that takes longer is abandoned (large repositories still fit).
CLONE_TIMEOUT_S = 1800
#: Local git commands on the seed.
GIT_TIMEOUT_S = 120
#: Stderr of a failed git command kept for the error message.
MAX_ERROR_CHARS = 800

#: The user name sent with the token (GitHub's convention for tokens).
TOKEN_USER = "x-access-token"
#: What ``server_url`` accepts as the origin's host[:port] (it is embedded in
#: the askpass helper's ``case`` patterns, so no shell or glob character).
_NETLOC_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})(?::[0-9]{1,5})?")


def askpass_script(origin: str) -> str:
    """The askpass helper for ``origin`` (``scheme://host[:port]``, checked).

    It answers git's two prompts for exactly that origin -- ``Username for
    'ORIGIN': `` and ``Password for 'SCHEME://x-access-token@HOST': `` -- and
    exits 1 with no output for anything else (another host after a
    redirect, a proxy, a different user), so the token goes nowhere else.
    The secret is read from the clone child's environment, never stored here.
    """
    scheme, _, netloc = origin.partition("://")
    if scheme not in ("https", "http") or _NETLOC_RE.fullmatch(netloc) is None:
        raise StagingError(f"cannot build an askpass helper for {origin!r}")
    return (
        "#!/bin/sh\n"
        "# Staging askpass helper (spec 14.6): answers only for the configured server.\n"
        'case "$1" in\n'
        f"  \"Username for '{scheme}://{netloc}'\"*) printf '%s\\n' {TOKEN_USER} ;;\n"
        f"  \"Password for '{scheme}://{TOKEN_USER}@{netloc}'\"*)"
        " printf '%s\\n' \"$BQ_STAGING_CREDENTIAL\" ;;\n"
        "  *) exit 1 ;;\n"
        "esac\n"
    )


class StagingError(Exception):
    """A seed cannot be staged or verified (the run aborts with exit 2)."""


@dataclass(frozen=True, slots=True)
class SeedSpec:
    """What to stage for one repository; ``source`` set means --seed-source."""

    repo: PrivateRepo
    source: Path | None = None


@dataclass(frozen=True, slots=True)
class StagedSeed:
    """A staged, scrubbed, read-only seed."""

    repo: str
    sensitivity: str
    seed_id: str
    commit: str
    path: Path
    seconds: float


def server_url(env: Mapping[str, str], *, allow_insecure: bool = False) -> str:
    """``$GITHUB_SERVER_URL`` (default https://github.com), checked and normalized.

    Plain ``http://`` is accepted only with ``allow_insecure`` (the operator's
    ``--allow-insecure-server-url``): the token would cross the network in
    clear text.

    Raises:
        StagingError: not https (or http when allowed), carries user info, a
            query or a fragment, or a host[:port] with unusual characters.
    """
    raw = env.get("GITHUB_SERVER_URL") or "https://github.com"
    parts = urlsplit(raw)
    if (
        parts.scheme not in ("https", "http")
        or not parts.hostname
        or "@" in parts.netloc
        or parts.query
        or parts.fragment
        or any(c.isspace() for c in raw)
        or _NETLOC_RE.fullmatch(parts.netloc) is None
    ):
        raise StagingError(
            "GITHUB_SERVER_URL must be a plain https://host[:port][/path] URL without "
            "credentials, query or fragment"
        )
    if parts.scheme != "https" and not allow_insecure:
        raise StagingError(
            "GITHUB_SERVER_URL is not https:// (the token would travel in clear text); "
            "pass --allow-insecure-server-url only for a local test server"
        )
    return raw.rstrip("/")


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def create_private_root(paths: RunPaths) -> None:
    """Create the private root and ``seeds/``; both must be new.

    As root both are ``root:65534`` 0710 (:data:`PRIVATE_ROOT_MODE_ROOT`):
    only the query's group may traverse them, so no other unprivileged user
    (a host agent) can reach anything below. Otherwise (a
    non-root harness cannot give a directory to group 65534) 0711.

    Raises:
        StagingError: the root already exists or cannot be created.
    """
    as_root = os.geteuid() == 0
    mode = PRIVATE_ROOT_MODE_ROOT if as_root else PRIVATE_ROOT_MODE
    try:
        paths.private_root.parent.mkdir(parents=True, exist_ok=True)
        for directory in (paths.private_root, paths.seeds_dir):
            os.mkdir(directory, 0o700)
            if as_root:
                os.chown(directory, -1, QUERY_UID, follow_symlinks=False)
            os.chmod(directory, mode)
    except FileExistsError:
        raise StagingError(f"private root {paths.private_root} already exists") from None
    except OSError as exc:
        raise StagingError(f"cannot create the private root: {exc.strerror}") from None


def remove_read_only_tree(path: Path) -> None:
    """Delete ``path`` recursively, restoring write bits where needed (a sealed seed, the roots).

    Unlike the broker's ``workspace.remove_tree`` (hostile trees, never raises), this one
    deletes trees we made and raises ``OSError`` when it cannot.
    """

    def retry(function: Callable[..., object], failed: str, _exc: object) -> None:
        parent = os.path.dirname(failed)
        os.chmod(parent, 0o700)
        if os.path.isdir(failed) and not os.path.islink(failed):
            os.chmod(failed, 0o700)
        function(failed)

    if os.path.lexists(path):
        if path.is_dir() and not path.is_symlink():
            os.chmod(path, 0o700)
            # onerror is deprecated from 3.12 on; onexc (3.12+) gets the same retry.
            if sys.version_info >= (3, 12):
                shutil.rmtree(path, onexc=retry)
            else:
                shutil.rmtree(path, onerror=retry)
        else:
            path.unlink()


def _scrub_secret(text: str, secret: str | None) -> str:
    if secret:
        text = text.replace(secret, "***")
    return text[-MAX_ERROR_CHARS:]


def _git_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C",
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ATTR_NOSYSTEM": "1",
    }
    env.update(extra or {})
    return env


def _git(seed: Path, home: Path, *args: str) -> str:
    command = ["git", "-c", "core.hooksPath=/dev/null", "-C", str(seed), *args]
    try:
        done = subprocess.run(
            command,
            env=_git_env(home),
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StagingError(f"git {args[0]} failed: {exc}") from None
    if done.returncode != 0:
        raise StagingError(f"git {args[0]} failed: {done.stderr.strip()[-MAX_ERROR_CHARS:]}")
    return done.stdout


def _clone(
    spec: SeedSpec,
    dest: Path,
    staging: Path,
    env: Mapping[str, str],
    token: str | None,
    progress: bool,
    allow_insecure: bool = False,
) -> None:
    home = staging / "home"
    home.mkdir(mode=0o700, exist_ok=True)
    base = [
        "git",
        "-c",
        "credential.helper=",
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "protocol.version=2",
        "clone",
        "--progress" if progress else "--quiet",
        "--no-recurse-submodules",
    ]
    extra: dict[str, str] = {}
    if spec.source is not None:
        source = os.path.abspath(spec.source)
        command = [*base, "--no-local", "--", source, str(dest)]
        extra["GIT_ALLOW_PROTOCOL"] = "file"
    else:
        if token is None:
            raise StagingError(f"{spec.repo.repo}: no staging credential in GH_TOKEN/GITHUB_TOKEN")
        server = server_url(env, allow_insecure=allow_insecure)
        askpass = staging / "askpass.sh"
        fd = os.open(askpass, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
        with os.fdopen(fd, "w") as handle:
            handle.write(askpass_script(_origin(server)))
        url = f"{server}/{spec.repo.repo}.git"
        command = [*base, "--", url, str(dest)]
        extra.update(
            {
                "GIT_ASKPASS": str(askpass),
                CREDENTIAL_VARIABLE: token,
                "GIT_ALLOW_PROTOCOL": "https:http",
            }
        )
    try:
        done = subprocess.run(
            command,
            env=_git_env(home, extra),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=None if progress else subprocess.PIPE,
            timeout=CLONE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        detail = _scrub_secret(str(exc), token)
        raise StagingError(f"{spec.repo.repo}: clone failed: {detail}") from None
    if done.returncode != 0:
        detail = "" if done.stderr is None else done.stderr.decode("utf-8", "replace").strip()
        raise StagingError(
            f"{spec.repo.repo}: clone failed (git exit {done.returncode}): "
            + _scrub_secret(detail, token)
        )


def reject_external_references(seed: Path) -> None:
    """Reject a symlinked ``.git``, a gitdir pointer and submodules (14.6 step 5).

    Raises:
        StagingError: the checkout refers outside itself.
    """
    dot_git = seed / ".git"
    try:
        mode = os.lstat(dot_git).st_mode
    except OSError:
        raise StagingError("the checkout has no .git directory") from None
    if stat.S_ISLNK(mode):
        raise StagingError("the checkout's .git is a symlink")
    if not stat.S_ISDIR(mode):
        raise StagingError("the checkout's .git is a gitdir pointer, not a directory")
    if os.path.lexists(seed / ".gitmodules") or os.path.lexists(dot_git / "modules"):
        raise StagingError("the repository declares submodules, which are not supported")


#: The seed's whole ``.git/config`` (step 4). ``checkStat = minimal``
#: (fast ``git status`` on gVisor): git decides that a tracked file is
#: unchanged from its size and the whole seconds of its mtime alone, not from
#: inode, device, owner or ctime.
#: The index is refreshed by the broker's view-layer preparation on runc
#: (sandbox/overlay.py), and every query sees the same files through another
#: mount (other inode numbers in the query's overlay, and gVisor's gofer
#: numbers inodes in the order they are first looked up), so with the default
#: check ``git status`` re-hashes every file of a clean tree (3.3 s instead of
#: 0.09 s for 20,000 files under gVisor). The price: an edit that keeps a
#: file's size and sets its mtime back to the same second (``touch -r``,
#: ``tar x``, ``cp -p`` of a same-size file) is not seen unless git's
#: racy-entry rule applies; ``git -c core.checkStat=default status`` sees it,
#: re-hashing the tree.
_MINIMAL_CONFIG = """[core]
\trepositoryformatversion = {version}
\tfilemode = true
\tbare = false
\tlogallrefupdates = false
\tcheckStat = minimal
"""


def scrub(seed: Path, home: Path) -> None:
    """Remove every external reference and credential path from ``.git`` (14.6 step 4)."""
    dot_git = seed / ".git"
    object_format = _git(seed, home, "rev-parse", "--show-object-format").strip() or "sha1"
    config = _MINIMAL_CONFIG.format(version=0 if object_format == "sha1" else 1)
    if object_format != "sha1":
        config += f"[extensions]\n\tobjectformat = {object_format}\n"
    (dot_git / "config").write_text(config)
    # "remotes" and "branches" are git's legacy remote definitions;
    # "config.worktree" is per-worktree config (it may hold credentials too).
    for name in ("hooks", "logs", "worktrees", "refs/remotes", "remotes", "branches"):
        remove_read_only_tree(dot_git / name)
    for name in (
        "FETCH_HEAD",
        "ORIG_HEAD",
        "objects/info/alternates",
        "objects/info/http-alternates",
        "commondir",
        "gitdir",
        "config.worktree",
    ):
        remove_read_only_tree(dot_git / name)
    packed = dot_git / "packed-refs"
    if packed.exists():
        kept: list[str] = []
        skipping = False
        for line in packed.read_text().splitlines():
            if line.startswith("^"):
                if not skipping:
                    kept.append(line)
                continue
            fields = line.split(" ", 1)
            skipping = len(fields) == 2 and fields[1].startswith("refs/remotes/")
            if not skipping:
                kept.append(line)
        packed.write_text("".join(f"{line}\n" for line in kept))
    leftover = _git(seed, home, "for-each-ref", "--format=%(refname)", "refs/remotes/")
    if leftover.strip() or _git(seed, home, "remote").strip():
        raise StagingError("remote references survived scrubbing")


def make_read_only(seed: Path) -> None:
    """Strip every write bit: directories 0555, files 0444 (0555 if executable).

    Raises:
        StagingError: a special file (device, FIFO, socket) is present.
    """
    for root, dirs, files in os.walk(seed, topdown=False):
        for name in files + dirs:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                continue
            if stat.S_ISDIR(mode):
                os.chmod(path, 0o555)
            elif stat.S_ISREG(mode):
                os.chmod(path, 0o555 if mode & 0o111 else 0o444)
            else:
                raise StagingError("the checkout contains a special file")
    os.chmod(seed, 0o555)


#: ``find`` expression matching what the query uid could not read or could write.
_FIND_PROBLEMS = (
    "(",
    "(",
    "-type",
    "d",
    "(",
    "!",
    "-readable",
    "-o",
    "!",
    "-executable",
    ")",
    ")",
    "-o",
    "(",
    "!",
    "-type",
    "l",
    "!",
    "-readable",
    ")",
    "-o",
    "(",
    "!",
    "-type",
    "l",
    "-writable",
    ")",
    ")",
)


def verify_seed(seed: Path, private_root: Path) -> None:
    """Verify the seed is read-only for everyone and readable by the query uid (step 6).

    Statically: no entry has a write bit; directories are o+rx, files o+r;
    the private root and every directory down to the seed are o+x (or g+x
    with the query's group, ``create_private_root`` as root). When
    running as root, also for real: ``find`` as uid 65534 must reach every
    entry through the private root, read it, and find nothing writable.

    Raises:
        StagingError: any violation (named by its seed-relative path).
    """
    ancestor = seed.parent
    while True:
        st = os.stat(ancestor)
        by_group = st.st_gid == QUERY_UID and st.st_mode & 0o010
        if not (st.st_mode & 0o001 or by_group):
            raise StagingError(f"{ancestor} is not traversable by the query uid")
        if ancestor == private_root or ancestor == ancestor.parent:
            break
        ancestor = ancestor.parent
    for root, dirs, files in os.walk(seed):
        for name in [*dirs, *files, *([""] if root == str(seed) else [])]:
            path = os.path.join(root, name) if name else root
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                continue
            needed = 0o005 if stat.S_ISDIR(mode) else 0o004
            if mode & 0o222 or (mode & needed) != needed:
                rel = os.path.relpath(path, seed)
                raise StagingError(f"seed entry {rel!r} has mode {stat.filemode(mode)}")
    if os.geteuid() != 0:
        return
    try:
        done = subprocess.run(
            ["find", str(seed), *_FIND_PROBLEMS, "-print"],
            user=QUERY_UID,
            group=QUERY_UID,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StagingError(f"cannot run the uid {QUERY_UID} read probe: {exc}") from None
    if done.returncode != 0 or done.stdout.strip():
        shown = (done.stdout + done.stderr).replace(str(seed), "<seed>").strip()
        raise StagingError(f"uid {QUERY_UID} cannot read the seed: {shown[:MAX_ERROR_CHARS]}")


def _stage_one(
    spec: SeedSpec,
    paths: RunPaths,
    env: Mapping[str, str],
    token: str | None,
    progress: bool,
    allow_insecure: bool = False,
) -> StagedSeed:
    started = time.monotonic()
    seed_id = secrets.token_hex(16)
    dest = paths.seeds_dir / seed_id
    staging = paths.staging_dir
    staging.mkdir(mode=0o700)
    try:
        _clone(spec, dest, staging, env, token, progress, allow_insecure)
        reject_external_references(dest)
        home = staging / "home"
        commit = _git(dest, home, "rev-parse", "--verify", "HEAD^{commit}").strip()
        if len(commit) not in (40, 64) or commit.strip("0123456789abcdef"):
            raise StagingError(f"{spec.repo.repo}: unexpected commit id")
        scrub(dest, home)
        reject_external_references(dest)
        make_read_only(dest)
        verify_seed(dest, paths.private_root)
    except StagingError as exc:
        if str(exc).startswith(spec.repo.repo + ":"):
            raise
        raise StagingError(f"{spec.repo.repo}: {exc}") from None
    finally:
        remove_read_only_tree(staging)
    return StagedSeed(
        repo=spec.repo.repo,
        sensitivity=spec.repo.sensitivity,
        seed_id=seed_id,
        commit=commit,
        path=dest,
        seconds=time.monotonic() - started,
    )


def stage_seeds(
    specs: list[SeedSpec],
    paths: RunPaths,
    env: Mapping[str, str],
    token: str | None,
    *,
    progress: bool | None = None,
    on_staged: Callable[[StagedSeed], None] | None = None,
    allow_insecure_server: bool = False,
) -> list[StagedSeed]:
    """Stage every repository into the (already created) private root.

    ``progress`` defaults to "stderr is a terminal" (git shows its progress
    there; otherwise git's stderr is captured for error messages only).
    ``allow_insecure_server`` admits a plain-http ``GITHUB_SERVER_URL``.

    Raises:
        StagingError: the first failure; nothing of the staging HOME or the
            askpass helper survives it.
    """
    if progress is None:
        progress = sys.stderr.isatty()
    staged: list[StagedSeed] = []
    for spec in specs:
        seed = _stage_one(spec, paths, env, token, progress, allow_insecure_server)
        staged.append(seed)
        if on_staged is not None:
            on_staged(seed)
    return staged
