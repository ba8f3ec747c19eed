"""Owner records and the sweep of roots left by a killed harness (spec 14.8).

Theory of operation: teardown (``teardown.py``) deletes both roots and unmounts
the workspace tmpfs, but a harness killed with SIGKILL runs no teardown. Its
reaper (``reaper.py``) then undoes the run within seconds; when the reaper
was killed too (an OOM kill, a kill of every process of the job, a power
cut), the private root (seeds: private source code), the ingress root and
the tmpfs stay behind, under run-unique names that never collide and so are
never reused: this sweep is the fallback.

So every root carries an *owner record*, ``<privateRoot>/control/harness.json``
(0600, next to the broker's ``control/ready``), written right after the
private root is created::

    {"version": 1, "mode": "run", "pid": 1234, "startTime": 5678,
     "bootId": "...", "pidNamespace": "pid:[4026531836]", "runId": "..."}

``startTime`` is field 22 of ``/proc/<pid>/stat`` (clock ticks since boot),
so a reused PID is told apart from the owner. The detached ``compose``
command writes ``"mode": "compose"``: its roots belong to the compose
project and ``compose-down`` removes them, so the sweep never does.

At the start of ``run`` and ``compose``, :func:`sweep_stale_roots` looks at
every private root of this uid under the same base -- the bounded-query
roots and the bounded-agent roots (``paths.ROOT_PREFIXES``) alike; each
bounded-agent private root carries its own owner record, naming the same
run. A root is removed only
when all of these hold:

* its name is exactly ``<prefix><uid>-<16 hex digits>`` and it is a real
  directory (never a symlink) owned by this uid;
* its owner record is readable (opened without following any symlink, a
  regular file owned by this uid), has mode ``run`` and names a process
  that is gone: another boot, no such PID, a zombie, or a PID whose start
  time differs (reused);
* the owner ran in this PID namespace (or on another boot): a PID from a
  different namespace says nothing here.

A root without a readable record (an older harness, or one being created
this very moment) is skipped and reported; so is one owned by a live
process or a compose project. Removal unmounts everything mounted at or
below the private root (deepest first, lazily if busy; a mount that cannot
be unmounted keeps the root), then deletes the ingress root with the same
``<uid>-<digest>`` suffix and the private root with the helper teardown
uses. Nothing outside ``<base>/<prefix><uid>-*`` is touched.

The dead run's engine objects go first: its broker died with it, but the
query containers it had started (no in-container timeout: the broker's
timer was their only bound) and the volumes mounted under its private root
would outlive it. When the record names the run (``runId``, optional so an
older record still parses), the sweep's ``reconcile`` callback removes the
containers and volumes labelled with that run id (``teardown.py``, the one
label reconcile), and only that run's: other harnesses on the engine are
never touched. A reconcile that fails (engine down) is reported on the
``stale_root_removed`` event; the mounts below the root are still unmounted.

Events carry the ``<uid>-<digest>`` suffix only, never a path.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bounded_query.broker.mounts import unmount
from bounded_query.broker.protocol.policy import RUN_ID_PATTERN
from bounded_query.harness.lifecycle.paths import ROOT_PREFIXES, RunPaths
from bounded_query.harness.records.events import EventSink
from bounded_query.harness.staging.outputs import remove_roots, write_json_private

__all__ = [
    "MODE_COMPOSE",
    "MODE_RUN",
    "OWNER_RECORD",
    "OwnerRecord",
    "SweepResult",
    "current_owner",
    "owner_is_gone",
    "process_start_time",
    "read_owner_record",
    "remove_run_roots",
    "sweep_stale_roots",
    "write_owner_record",
]

#: The owner record, relative to the private root (next to ``control/ready``).
OWNER_RECORD = Path("control") / "harness.json"
MODE_RUN = "run"
MODE_COMPOSE = "compose"
RECORD_VERSION = 1
#: An owner record is a few hundred bytes; anything larger is not one.
MAX_RECORD_BYTES = 4096
_DIGEST_RE = re.compile(r"[0-9a-f]{16}")
#: A run id (``policy.RUN_ID_PATTERN``) -- anything else is never used as a label filter.
_RUN_ID_RE = re.compile(RUN_ID_PATTERN)


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    """Who created a pair of roots."""

    mode: str
    pid: int
    start_time: int
    boot_id: str
    pid_namespace: str
    #: The run's id (its engine label); "" when unknown (an older record).
    run_id: str = ""

    def to_doc(self) -> dict[str, Any]:
        """The JSON document written to :data:`OWNER_RECORD`."""
        doc: dict[str, Any] = {
            "version": RECORD_VERSION,
            "mode": self.mode,
            "pid": self.pid,
            "startTime": self.start_time,
            "bootId": self.boot_id,
            "pidNamespace": self.pid_namespace,
        }
        if self.run_id:
            doc["runId"] = self.run_id
        return doc

    @classmethod
    def from_doc(cls, doc: object) -> OwnerRecord | None:
        """Parse a record document; None when it is not a valid version-1 record."""
        if not isinstance(doc, dict) or doc.get("version") != RECORD_VERSION:
            return None
        mode, pid, start = doc.get("mode"), doc.get("pid"), doc.get("startTime")
        boot, pidns = doc.get("bootId"), doc.get("pidNamespace")
        if mode not in (MODE_RUN, MODE_COMPOSE) or not isinstance(boot, str):
            return None
        if not isinstance(pidns, str):
            return None
        if type(pid) is not int or type(start) is not int or pid < 1 or start < 0:
            return None
        run_id = doc.get("runId", "")
        if not isinstance(run_id, str) or (run_id and not _RUN_ID_RE.fullmatch(run_id)):
            return None
        return cls(mode, pid, start, boot, pidns, run_id)


def process_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat``; None when there is no such live process.

    A zombie (state ``Z``) counts as gone: it has exited, and its teardown
    either ran or never will.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain anything:
    # fields 3.. follow the last ')'.
    fields = raw.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[0] == "Z":
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def current_owner(mode: str, run_id: str = "") -> OwnerRecord:
    """The owner record describing this process (and its run, when given)."""
    pid = os.getpid()
    start = process_start_time(pid)
    if start is None:
        raise OSError(f"cannot read the start time of process {pid} from /proc")
    return OwnerRecord(mode, pid, start, _boot_id(), _pid_namespace(), run_id)


def write_owner_record(private_root: Path, record: OwnerRecord) -> None:
    """Create ``control/`` (0700) and write the record (0600) below ``private_root``."""
    control = private_root / OWNER_RECORD.parent
    control.mkdir(mode=0o700, exist_ok=True)
    os.chmod(control, 0o700, follow_symlinks=False)
    write_json_private(private_root / OWNER_RECORD, record.to_doc())


def _open_nofollow(name: str, dir_fd: int | None, flags: int) -> int:
    return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def read_owner_record(private_root: Path, uid: int) -> OwnerRecord | None:
    """Read the owner record without following any symlink; None when unusable."""
    fds: list[int] = []
    try:
        fds.append(_open_nofollow(str(private_root), None, os.O_RDONLY | os.O_DIRECTORY))
        for part in OWNER_RECORD.parent.parts:
            fds.append(_open_nofollow(part, fds[-1], os.O_RDONLY | os.O_DIRECTORY))
        fd = _open_nofollow(OWNER_RECORD.name, fds[-1], os.O_RDONLY | os.O_NONBLOCK)
        fds.append(fd)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            return None
        data = os.read(fd, MAX_RECORD_BYTES + 1)
    except OSError:
        return None
    finally:
        for fd in reversed(fds):
            os.close(fd)
    if len(data) > MAX_RECORD_BYTES:
        return None
    try:
        return OwnerRecord.from_doc(json.loads(data))
    except ValueError:
        return None


def owner_is_gone(
    record: OwnerRecord,
    *,
    start_time_of: Callable[[int], int | None] = process_start_time,
    boot_id: str | None = None,
    pid_namespace: str | None = None,
) -> str | None:
    """Why the record's ``run`` owner is certainly gone, or None if it may be alive."""
    if record.mode != MODE_RUN:
        return None
    boot = _boot_id() if boot_id is None else boot_id
    if record.boot_id and boot and record.boot_id != boot:
        return "owner ran before a reboot"
    pidns = _pid_namespace() if pid_namespace is None else pid_namespace
    if not record.pid_namespace or record.pid_namespace != pidns:
        return None
    start = start_time_of(record.pid)
    if start is None:
        return "owner exited"
    if start != record.start_time:
        return "owner exited; its pid was reused"
    return None


def _mountinfo_points() -> list[str]:
    points: list[str] = []
    try:
        text = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return points
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            # Octal escapes (\040 for a space, ...) as the kernel writes them.
            points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def _mounts_below(root: str) -> list[str]:
    """Mount points at or below ``root``, deepest first."""
    found = [p for p in _mountinfo_points() if p == root or p.startswith(root + "/")]
    return sorted(set(found), key=lambda p: (p.count("/"), p), reverse=True)


@dataclass(frozen=True, slots=True)
class SweepResult:
    """Counts of one sweep (also reported as ``stale_roots_swept``)."""

    removed: int = 0
    live: int = 0
    compose: int = 0
    skipped: int = 0
    failed: int = 0


def _is_own_dir(path: Path, uid: int) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == uid


def sweep_stale_roots(
    base: Path,
    uid: int,
    sink: EventSink,
    reconcile: Callable[[str], object] | None = None,
) -> SweepResult:
    """Remove the roots of dead ``run`` owners of ``uid`` under ``base`` (blocking).

    ``reconcile(run_id)`` removes a dead run's containers and volumes before
    its root goes (skipped when None or the record names no run).

    Never raises on a root it cannot handle: it is skipped or reported as
    failed, and the next run tries again. Emits ``stale_root_removed``,
    ``stale_root_skipped``, ``stale_root_failed`` per root and one
    ``stale_roots_swept`` when any root of this uid was found.
    """
    counts = {"removed": 0, "live": 0, "compose": 0, "skipped": 0, "failed": 0}
    real_base = Path(os.path.realpath(base))
    try:
        names = sorted(os.listdir(real_base))
    except OSError:
        return SweepResult()
    boot, pidns = _boot_id(), _pid_namespace()
    for name, private_prefix, ingress_prefix in _private_roots(names, uid):
        suffix = name[len(private_prefix) :]
        private_root = real_base / name
        if not _is_own_dir(private_root, uid):
            continue
        record = read_owner_record(private_root, uid)
        if record is None:
            counts["skipped"] += 1
            sink.emit("stale_root_skipped", root=suffix, reason="no readable owner record")
            continue
        if record.mode == MODE_COMPOSE:
            counts["compose"] += 1
            continue
        reason = owner_is_gone(record, boot_id=boot, pid_namespace=pidns)
        if reason is None:
            counts["live"] += 1
            continue
        ingress_root = real_base / f"{ingress_prefix}{suffix}"
        if os.path.lexists(ingress_root) and not _is_own_dir(ingress_root, uid):
            counts["skipped"] += 1
            reason = "its ingress root is not this user's directory"
            sink.emit("stale_root_skipped", root=suffix, reason=reason)
            continue
        engine = _reconcile_run(reconcile, record.run_id)
        outcome = remove_run_roots(RunPaths(private_root, ingress_root))
        if outcome is None:
            counts["removed"] += 1
            sink.emit("stale_root_removed", root=suffix, reason=reason, engine=engine)
        else:
            counts["failed"] += 1
            sink.emit("stale_root_failed", root=suffix, reason=reason, message=outcome)
    result = SweepResult(**counts)
    if any(counts.values()):
        sink.emit("stale_roots_swept", **counts)
    return result


def _private_roots(names: list[str], uid: int) -> list[tuple[str, str, str]]:
    """``(name, private prefix, ingress prefix)`` of every private root name of ``uid``."""
    found = []
    for private_prefix, ingress_prefix in ROOT_PREFIXES:
        prefix = f"{private_prefix}{uid}-"
        for name in names:
            if name.startswith(prefix) and _DIGEST_RE.fullmatch(name[len(prefix) :]):
                found.append((name, private_prefix, ingress_prefix))
    return found


def _reconcile_run(reconcile: Callable[[str], object] | None, run_id: str) -> str:
    """Remove a dead run's engine objects: "reconciled", "not-attempted" or "failed: <kind>"."""
    if reconcile is None or not run_id:
        return "not-attempted"
    try:
        reconcile(run_id)
    except Exception as exc:  # the engine's reason; the root still goes
        return f"failed: {exc.__class__.__name__}"
    return "reconciled"


def remove_run_roots(paths: RunPaths) -> str | None:
    """Unmount below the private root, then delete both roots; an error message or None.

    The removal of a dead run's roots, for the sweep and the reaper
    (``reaper.py``); blocking.
    """
    for point in _mounts_below(str(paths.private_root)):
        try:
            unmount(Path(point))
        except OSError as exc:
            return f"cannot unmount a file system below the private root ({exc.strerror})"
    if _mounts_below(str(paths.private_root)):
        return "a file system below the private root is still mounted"
    try:
        remove_roots(paths)
    except OSError as exc:
        return f"cannot delete the roots ({exc.strerror or exc.__class__.__name__})"
    return None
