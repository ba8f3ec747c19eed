"""Container specification of one query sandbox (spec 14.7), as plain values.

Theory of operation: everything about a query container is derived here from
trusted inputs only (``RunnerSettings`` from the broker's configuration, the
broker-generated ids and paths of an ``Invocation``, and our seccomp profile)
into the exact JSON body of the Engine API's ``POST /containers/create``. No
docker, trio or os import: the runner sends this body as is, and the unit
tests check it field by field. Nothing a request carries appears here: the
script travels as a file the broker wrote, never as an argument, variable or
label.

Layout seen by the query (uid/gid 65534, read-only root):

* ``/awf/seed`` - the trusted seed, bind-mounted read-only;
* ``/awf/query-script.py`` - the script, bind-mounted read-only;
* ``/query`` - a size-limited tmpfs owned by 65534, where the image's fixed
  entrypoint materializes the seed at ``/query/repo``;
  (or, by default, the copy-on-write overlay of :mod:`.overlay` is mounted
  there and the seed is not bound at all);
* ``/query/out`` - the pre-created, 65534-owned result file of the
  workspace, bind-mounted read-write (a mount point cannot be renamed over or
  unlinked, so symlink, FIFO or directory swaps fail with EBUSY);
* ``/tmp`` - a small size-limited tmpfs.

Kernel-global state (README "Residual channels"): every ``/proc``
file that reports host-wide counters a query could modulate or read across
invocations (load, memory, CPU and disk statistics, the kernel's dentry,
inode and file counts under ``/proc/sys/fs``, pressure, interrupts, locks,
the boot id) and the whole of ``/sys`` (disk I/O counters, cgroup counters,
CPU frequencies) are masked (``MaskedPaths``: an empty read-only tmpfs over a
directory, ``/dev/null`` over a file). Python and git read none of them
(glibc's CPU count falls back to ``sched_getaffinity``). Query containers run
on the CPUs of :func:`.cpus.query_cpus` (``CpusetCpus``).

gVisor's flags (``.ci/provision-engine`` registers ``runsc`` with them):
``--network=none``, ``--oci-seccomp`` (the profile below is enforced inside
the sandbox too) and ``--file-access-mounts=exclusive``: the
sentry caches the dentries and attributes of the bind mounts (the
repository overlay, script and result file) instead of revalidating every
path component with the gofer on each access. That leaks nothing between
invocations: each of those mounts is private to one invocation or immutable
while it runs (the seed and its view layer, written before any query), the
cache lives in the sentry of a sandbox that serves exactly one container and
dies with it, and the result file is read only after the container is gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bounded_query.broker.protocol import MAX_SCRIPT_BYTES, policy
from bounded_query.broker.protocol.policy import (
    LABEL_INVOCATION,
    LABEL_RUN,
    OCI_RUNTIMES,
    QUERY_GID,
    QUERY_UID,
)
from bounded_query.broker.runner import RESULT_FILE_NAME, Invocation, RunnerSettings

from .cpus import query_cpus

__all__ = [
    "CONTAINER_ENTRYPOINT",
    "CONTAINER_ENV",
    "CPU_NANOS",
    "MASKED_PATHS",
    "NOFILE_LIMIT",
    "PIDS_LIMIT",
    "PIDS_LIMIT_GVISOR",
    "PREPARED_SCRIPT_DIR",
    "READONLY_PATHS",
    "SCRIPT_FILE_NAME",
    "TMP_TMPFS_BYTES",
    "ContainerSpec",
    "container_name",
    "container_spec",
    "prepared_spec",
    "probe_spec",
    "translate_host_path",
]

#: One CPU: a query is a short, mostly single-threaded Python script, and the
#: broker serializes invocations on a two-core machine.
CPU_NANOS = 1_000_000_000
#: Enough for python, git and a few helpers; a fork bomb stops here.
PIDS_LIMIT = 128
#: Under runsc the host pids cgroup counts the sandbox's own tasks (sentry
#: threads, and on the ptrace platform one stub process per application
#: process, reaped lazily): measured with the query cpuset of one CPU, 60
#: sequential fork+exit+wait failed in 2 of 4 runs at 128, none at 512.
PIDS_LIMIT_GVISOR = 512
#: Open files per process: python and git need a few dozen.
NOFILE_LIMIT = 1024
#: /tmp is scratch space only; the repository lives in /query.
TMP_TMPFS_BYTES = 64 * 1024 * 1024
#: /dev/shm for multiprocessing; counted against the memory limit anyway.
SHM_BYTES = 16 * 1024 * 1024
#: Name of the script file inside the workspace (bound read-only).
SCRIPT_FILE_NAME = "script.py"
#: The image's fixed entrypoint (sandbox/image/entrypoint.py), restated so a
#: tampered image ENTRYPOINT cannot change what runs.
CONTAINER_ENTRYPOINT = ("/usr/bin/python3", "-I", "-S", "/awf/entrypoint.py")
#: The interpreter a prepared container's launcher runs in (its source
#: follows ``-c``; see :func:`prepared_spec`).
LAUNCHER_INTERPRETER = ("/usr/bin/python3", "-I", "-S", "-c")
#: The complete environment of a query: fixed, minimal, no secrets.
CONTAINER_ENV = (
    "PATH=/usr/bin:/bin",
    "LANG=C.UTF-8",
    "HOME=/tmp",
    "PYTHONDONTWRITEBYTECODE=1",
    "GIT_CONFIG_NOSYSTEM=1",
)
#: In-container paths (see the module docstring).
SEED_TARGET = "/awf/seed"
SCRIPT_TARGET = "/awf/query-script.py"
QUERY_TARGET = "/query"
REPO_TARGET = "/query/repo"
RESULT_TARGET = f"/query/{RESULT_FILE_NAME}"
TMP_TARGET = "/tmp"
#: A prepared container's own tmpfs where its launcher writes the delivered
#: script, so it is ``/awf/query-script.py`` as in a cold container (it hides
#: the image's entrypoint, which a prepared container does not run;
#: ``sandbox/launcher.py`` restates the path: it cannot import us).
PREPARED_SCRIPT_DIR = "/awf"
#: Its size: the largest script the protocol admits, rounded up to pages.
PREPARED_SCRIPT_DIR_BYTES = -(-MAX_SCRIPT_BYTES // 4096) * 4096
#: Docker's default masked paths (restated: ``MaskedPaths`` replaces them).
_DOCKER_MASKED = (
    "/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
    "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
    "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
)  # fmt: skip
#: Host-wide state a query need not read and could use as a channel from one
#: invocation to the next (see the module docstring). ``/sys`` covers
#: ``/sys/fs/cgroup`` (mounted below it) and ``/sys/block/*/stat``.
_CHANNEL_MASKED = (
    "/proc/loadavg", "/proc/stat", "/proc/meminfo", "/proc/vmstat", "/proc/diskstats",
    "/proc/partitions", "/proc/pressure", "/proc/uptime", "/proc/softirqs",
    "/proc/schedstat", "/proc/zoneinfo", "/proc/buddyinfo", "/proc/pagetypeinfo",
    "/proc/slabinfo", "/proc/swaps", "/proc/vmallocinfo", "/proc/locks", "/proc/cgroups",
    "/proc/key-users", "/proc/cpuinfo", "/proc/sys", "/proc/sysvipc", "/proc/kpagecount",
    "/proc/kpageflags", "/proc/kpagecgroup", "/proc/iomem", "/proc/ioports", "/proc/mtrr",
    "/proc/fs", "/proc/irq", "/proc/bus", "/proc/driver", "/proc/dynamic_debug",
    "/proc/sysrq-trigger", "/sys",
)  # fmt: skip
MASKED_PATHS = _DOCKER_MASKED + _CHANNEL_MASKED
#: Docker's default read-only paths (restated: ``ReadonlyPaths`` replaces them).
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
#: Log settings when the benchmark asks to keep the entrypoint's timing line.
BENCH_LOG_CONFIG: Mapping[str, Any] = {
    "Type": "local",
    "Config": {"max-size": "1m", "max-file": "1", "compress": "false"},
}
#: Every query container's name starts with this (ids follow).
_NAME_PREFIX = "bq-"


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """A container name and the Engine API create body for it."""

    name: str
    body: Mapping[str, Any]


def translate_host_path(path: str, host_path_map: tuple[tuple[str, str], ...]) -> str:
    """Map a broker-visible absolute path to the engine host's path.

    The longest matching prefix (on a path-component boundary) wins; a path
    no prefix matches is returned unchanged. Raises ValueError (local fault)
    for a relative path.
    """
    if not path.startswith("/"):
        raise ValueError(f"bind-mount source must be absolute: {path!r}")
    best: tuple[str, str] | None = None
    for inside, outside in host_path_map:
        prefix = inside.rstrip("/")
        if (path == prefix or path.startswith(prefix + "/")) and (
            best is None or len(prefix) > len(best[0])
        ):
            best = (prefix, outside.rstrip("/"))
    if best is None:
        return path
    prefix, outside = best
    return (outside + path[len(prefix) :]) or "/"


def container_name(run_id: str, invocation_id: str) -> str:
    """The unique, predictable name of an invocation's container."""
    return f"{_NAME_PREFIX}{run_id[:16]}-{invocation_id}"


def _tmpfs_options(size: int, mode: str) -> str:
    return f"rw,nosuid,nodev,noexec,size={size},uid={QUERY_UID},gid={QUERY_GID},mode={mode}"


def _bind(source: str, target: str, *, read_only: bool) -> dict[str, Any]:
    return {
        "Type": "bind",
        "Source": source,
        "Target": target,
        "ReadOnly": read_only,
        "BindOptions": {"Propagation": "rprivate"},
    }


def _host_config(
    settings: RunnerSettings, seccomp_json: str, mounts: list[Any], host_cpus: int | None
) -> dict[str, Any]:
    memory = settings.memory_bytes
    config: dict[str, Any] = {
        "Runtime": OCI_RUNTIMES[settings.runtime],
        "NetworkMode": "none",
        "ReadonlyRootfs": True,
        "CapDrop": ["ALL"],
        "CapAdd": None,
        "Privileged": False,
        "SecurityOpt": ["no-new-privileges:true", f"seccomp={seccomp_json}"],
        "Memory": memory,
        "MemorySwap": memory,
        "NanoCpus": CPU_NANOS,
        "PidsLimit": PIDS_LIMIT_GVISOR if settings.runtime == policy.RUNTIME_GVISOR else PIDS_LIMIT,
        "Ulimits": [
            {"Name": "nofile", "Soft": NOFILE_LIMIT, "Hard": NOFILE_LIMIT},
            # Large enough for any seed file the tmpfs can hold; the
            # entrypoint lowers it for the script itself.
            {"Name": "fsize", "Soft": memory, "Hard": memory},
            {"Name": "core", "Soft": 0, "Hard": 0},
        ],
        "Tmpfs": {
            QUERY_TARGET: _tmpfs_options(memory, "0755"),
            TMP_TARGET: _tmpfs_options(min(memory, TMP_TMPFS_BYTES), "1777"),
        },
        "ShmSize": SHM_BYTES,
        "Mounts": mounts,
        "IpcMode": "private",
        "AutoRemove": False,
        "LogConfig": {"Type": "none", "Config": {}},
        "OomScoreAdj": 500,
        "RestartPolicy": {"Name": "no"},
        "MaskedPaths": list(MASKED_PATHS),
        "ReadonlyPaths": list(READONLY_PATHS),
    }
    if host_cpus is not None:
        config["CpusetCpus"] = query_cpus(host_cpus)
    return config


def container_spec(
    settings: RunnerSettings,
    invocation: Invocation,
    seccomp_json: str,
    *,
    entrypoint_args: tuple[str, ...] = (),
    keep_logs: bool = False,
    repo_volume: str | None = None,
    host_cpus: int | None = None,
) -> ContainerSpec:
    """Derive the create body of one query container (spec 14.7).

    ``entrypoint_args`` and ``keep_logs`` exist for the benchmark
    (``--timings`` and a capped local log to read them from); the broker never
    passes them: query output is otherwise discarded (LogConfig "none").
    With ``repo_volume`` (the invocation's copy-on-write overlay, see
    :mod:`.overlay`) that volume is mounted at ``/query/repo`` instead of
    binding the seed for the entrypoint to copy. ``host_cpus`` (the engine
    host's CPU count; the runner always passes it) pins the container to
    :func:`.cpus.query_cpus`.

    Raises:
        KeyError: a runtime that is never launched ("sbx").
        ValueError: a relative path.
    """
    if settings.runtime not in OCI_RUNTIMES:
        raise KeyError(f"runtime {settings.runtime!r} is never launched")
    hmap = settings.host_path_map
    workspace = str(invocation.workspace)
    if repo_volume is None:
        repo_mount = _bind(
            translate_host_path(str(invocation.seed_dir), hmap), SEED_TARGET, read_only=True
        )
    else:
        repo_mount = {
            "Type": "volume",
            "Source": repo_volume,
            "Target": REPO_TARGET,
            "ReadOnly": False,
            "VolumeOptions": {"NoCopy": True},
        }
    mounts = [
        repo_mount,
        _bind(
            translate_host_path(f"{workspace}/{SCRIPT_FILE_NAME}", hmap),
            SCRIPT_TARGET,
            read_only=True,
        ),
        _bind(
            translate_host_path(f"{workspace}/{RESULT_FILE_NAME}", hmap),
            RESULT_TARGET,
            read_only=False,
        ),
    ]
    body: dict[str, Any] = {
        "Image": settings.image,
        "Entrypoint": list(CONTAINER_ENTRYPOINT),
        "Cmd": list(entrypoint_args),
        "User": f"{QUERY_UID}:{QUERY_GID}",
        "WorkingDir": QUERY_TARGET,
        "Env": list(CONTAINER_ENV),
        "Hostname": "query",
        "NetworkDisabled": True,
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "OpenStdin": False,
        "Tty": False,
        "StopSignal": "SIGKILL",
        "Labels": {LABEL_RUN: settings.run_id, LABEL_INVOCATION: invocation.invocation_id},
        "HostConfig": _host_config(settings, seccomp_json, mounts, host_cpus),
    }
    if keep_logs:
        body["HostConfig"]["LogConfig"] = BENCH_LOG_CONFIG
    return ContainerSpec(container_name(settings.run_id, invocation.invocation_id), body)


def prepared_spec(
    settings: RunnerSettings,
    slot_id: str,
    seccomp_json: str,
    launcher_source: str,
    *,
    workspace: str,
    repo_volume: str,
    host_cpus: int | None = None,
) -> ContainerSpec:
    """Derive the create body of a prepared query container.

    The same hardened body as :func:`container_spec` with the overlay at
    ``/query/repo`` and the result file bound from ``workspace`` (the
    slot's own storage, broker-visible path), except how the script
    arrives: there is no script bind (the request does not exist yet).
    The entrypoint is ``python3 -I -S -c launcher_source MAX_SCRIPT_BYTES``
    (the broker's own launcher, ``sandbox/launcher.py``), stdin is open for
    exactly one attach (``StdinOnce``: EOF when the runner closes it) and
    :data:`PREPARED_SCRIPT_DIR` is a small tmpfs for the delivered script.
    Every field depends only on the settings, the slot id, the seed's view
    and the workspace path: nothing of an earlier invocation.

    Raises:
        KeyError: a runtime that is never launched ("sbx").
        ValueError: a relative path.
    """
    if settings.runtime not in OCI_RUNTIMES:
        raise KeyError(f"runtime {settings.runtime!r} is never launched")
    hmap = settings.host_path_map
    mounts = [
        {
            "Type": "volume",
            "Source": repo_volume,
            "Target": REPO_TARGET,
            "ReadOnly": False,
            "VolumeOptions": {"NoCopy": True},
        },
        _bind(
            translate_host_path(f"{workspace}/{RESULT_FILE_NAME}", hmap),
            RESULT_TARGET,
            read_only=False,
        ),
    ]
    host_config = _host_config(settings, seccomp_json, mounts, host_cpus)
    host_config["Tmpfs"][PREPARED_SCRIPT_DIR] = _tmpfs_options(PREPARED_SCRIPT_DIR_BYTES, "0755")
    body: dict[str, Any] = {
        "Image": settings.image,
        "Entrypoint": [
            *LAUNCHER_INTERPRETER,
            launcher_source,
            str(MAX_SCRIPT_BYTES),
        ],
        "Cmd": [],
        "User": f"{QUERY_UID}:{QUERY_GID}",
        "WorkingDir": QUERY_TARGET,
        "Env": list(CONTAINER_ENV),
        "Hostname": "query",
        "NetworkDisabled": True,
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "OpenStdin": True,
        "StdinOnce": True,
        "Tty": False,
        "StopSignal": "SIGKILL",
        "Labels": {LABEL_RUN: settings.run_id, LABEL_INVOCATION: slot_id},
        "HostConfig": host_config,
    }
    return ContainerSpec(container_name(settings.run_id, slot_id), body)


def probe_spec(
    settings: RunnerSettings, probe_id: str, seccomp_json: str, *, host_cpus: int | None = None
) -> ContainerSpec:
    """A probe container: same hardening, no mounts, runs ``python3 -c pass``.

    Used by preflight to prove the runtime (gVisor) really starts containers.
    """
    body: dict[str, Any] = {
        "Image": settings.image,
        "Entrypoint": ["/usr/bin/python3", "-I", "-S", "-c", "pass"],
        "Cmd": [],
        "User": f"{QUERY_UID}:{QUERY_GID}",
        "WorkingDir": "/",
        "Env": list(CONTAINER_ENV),
        "Hostname": "query",
        "NetworkDisabled": True,
        "Tty": False,
        "StopSignal": "SIGKILL",
        "Labels": {LABEL_RUN: settings.run_id, LABEL_INVOCATION: probe_id},
        "HostConfig": _host_config(settings, seccomp_json, [], host_cpus),
    }
    return ContainerSpec(container_name(settings.run_id, probe_id), body)
