"""Copy-on-write repository views for query containers, as plain values.

Theory of operation (docs/architecture.md decision 3, measured in the benchmark): writing
20,000 files into a tmpfs costs about 2 s under runc and 10 s under runsc per
invocation. Instead, each query gets ``/query/repo`` as an overlayfs whose
lower layers are the seed (never modified) and whose upper layer is the
invocation's private workspace directory, so materialization is O(1) and the
query still owns a private, fully writable tree.

Ownership: the seed is root-owned with write bits stripped, so an overlay
straight on top of it would give uid 65534 a read-only tree. Once per seed
and run, a *view layer* fixes that: a trusted preparation container (fixed
argv, root with only CAP_CHOWN and CAP_FOWNER, no network, runc) chowns the
tree to 65534 and adds owner write bits through an overlay mounted with
``metacopy=on``, so only metadata is copied up (no file data), and refreshes
the git index so that ``git status`` need not re-hash every file: queries see
the view through another mount (other inode numbers; under gVisor the
gofer's own), so this relies on the seed's ``core.checkStat = minimal``
(harness/staging.py), which compares only size and mtime seconds, and those
agree on both runtimes (tests/sandbox/test_git_stat_engine.py). The view
layer is kept in a Docker-managed volume for the life of the run; each
invocation's overlay stacks ``view:seed`` as its lower layers.

Every mount is made by dockerd through the local volume driver (``type=
overlay``), so the broker needs no mount privilege and the same code works
when the broker itself runs in a container. Quota: when the harness runs as
root, the private root's ``work/`` is a tmpfs of half the memory limit
(harness/quota.py), so the upper layer has a hard quota (ENOSPC); otherwise
it is on the private root's disk, bounded by RLIMIT_FSIZE per file, the PID
and open-file limits and the wall-clock timeout (the bound spec 14.7
states), the run is reported degraded, and the writes are deleted with the
workspace.

This module only derives names and request bodies; the runner performs them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bounded_query.broker.protocol import policy
from bounded_query.broker.protocol.policy import (
    LABEL_INVOCATION,
    LABEL_ROLE,
    LABEL_RUN,
    QUERY_GID,
    QUERY_UID,
)
from bounded_query.broker.runner import RunnerSettings

from .spec import CONTAINER_ENV

__all__ = [
    "OVERLAY_OPTION_FORBIDDEN",
    "PREP_COMMAND",
    "VolumeSpec",
    "invocation_volume",
    "overlay_safe",
    "prep_container_body",
    "seed_volumes",
]

#: Characters that would break overlayfs' comma/colon separated option string.
OVERLAY_OPTION_FORBIDDEN = frozenset(",:\\\n\t ")
#: Where the preparation container sees the view being prepared.
PREP_TARGET = "/v"
#: The preparation command (fixed; runs as root with CAP_CHOWN + CAP_FOWNER).
#: chown/chmod through a metacopy overlay copy up metadata only. The git index
#: refresh records the view's stat data so queries start with a clean status
#: (best effort: a seed without git, or a refresh failure, still succeeds).
PREP_COMMAND = (
    "/bin/sh",
    "-c",
    f"chown -R {QUERY_UID}:{QUERY_GID} {PREP_TARGET} && chmod -R u+w {PREP_TARGET} && "
    f"if [ -d {PREP_TARGET}/.git ]; then "
    f"git -c safe.directory='*' -c core.fsmonitor=false -c core.hooksPath=/dev/null "
    f"-C {PREP_TARGET} update-index -q --refresh >/dev/null 2>&1; "
    f"chown {QUERY_UID}:{QUERY_GID} {PREP_TARGET}/.git/index 2>/dev/null; fi; "
    # The view's root is the volume's host directory: make it root-only so no
    # host user can reach the 65534-owned entries below it. Queries never see
    # it (their overlay root is the workspace's upper directory).
    f"chown 0:0 {PREP_TARGET} && chmod 0700 {PREP_TARGET}",
)


@dataclass(frozen=True, slots=True)
class VolumeSpec:
    """Arguments of ``POST /volumes/create``."""

    name: str
    driver_opts: Mapping[str, str]
    labels: Mapping[str, str]


def overlay_safe(*paths: str) -> bool:
    """True when every path can appear in an overlayfs option string."""
    return all(
        path.startswith("/") and not (set(path) & OVERLAY_OPTION_FORBIDDEN) for path in paths
    )


def _seed_key(run_id: str, seed_host_path: str) -> str:
    digest = hashlib.sha256(seed_host_path.encode("utf-8", "surrogateescape")).hexdigest()
    return f"bq-{run_id[:16]}-seed-{digest[:16]}"


def _overlay_opts(lower: str, upper: str, work: str) -> dict[str, str]:
    return {
        "type": "overlay",
        "device": "overlay",
        "o": f"lowerdir={lower},upperdir={upper},workdir={work},metacopy=on",
    }


@dataclass(frozen=True, slots=True)
class SeedVolumes:
    """The per-seed volumes: plain ``upper``/``work`` storage and the prep overlay."""

    upper: VolumeSpec
    work: VolumeSpec

    def prep(self, seed_host_path: str, upper_dir: str, work_dir: str) -> VolumeSpec:
        """The overlay the preparation container writes the view layer through."""
        return VolumeSpec(
            f"{self.upper.name}-prep",
            _overlay_opts(seed_host_path, upper_dir, work_dir),
            {**self.upper.labels, LABEL_ROLE: "seed-prep"},
        )


def seed_volumes(settings: RunnerSettings, seed_host_path: str) -> SeedVolumes:
    """Names and labels of one seed's view-layer volumes for this run."""
    base = _seed_key(settings.run_id, seed_host_path)
    labels = {LABEL_RUN: settings.run_id}
    return SeedVolumes(
        VolumeSpec(f"{base}-view", {}, {**labels, LABEL_ROLE: "seed-view"}),
        VolumeSpec(f"{base}-work", {}, {**labels, LABEL_ROLE: "seed-work"}),
    )


def invocation_volume(
    settings: RunnerSettings,
    invocation_id: str,
    *,
    view_dir: str,
    seed_host_path: str,
    upper_dir: str,
    work_dir: str,
) -> VolumeSpec:
    """The per-invocation overlay: lower ``view:seed``, upper in the workspace."""
    return VolumeSpec(
        f"bq-{settings.run_id[:16]}-{invocation_id}-repo",
        _overlay_opts(f"{view_dir}:{seed_host_path}", upper_dir, work_dir),
        {
            LABEL_RUN: settings.run_id,
            LABEL_INVOCATION: invocation_id,
            LABEL_ROLE: "query-repo",
        },
    )


def prep_container_body(settings: RunnerSettings, prep_volume: str) -> dict[str, Any]:
    """Create body of the trusted preparation container (no request input).

    Runs on runc whatever the query runtime is: it executes only the fixed
    ``PREP_COMMAND`` of our own image on trusted data, and runc does the
    20,000 metadata updates in about a second where runsc would take far
    longer.
    """
    return {
        "Image": settings.image,
        "Entrypoint": list(PREP_COMMAND),
        "Cmd": [],
        "User": "0:0",
        "WorkingDir": "/",
        "Env": list(CONTAINER_ENV),
        "NetworkDisabled": True,
        "Tty": False,
        "Labels": {LABEL_RUN: settings.run_id, LABEL_ROLE: "seed-prep"},
        "HostConfig": {
            "Runtime": policy.OCI_RUNC,
            "NetworkMode": "none",
            "ReadonlyRootfs": True,
            "CapDrop": ["ALL"],
            "CapAdd": ["CAP_CHOWN", "CAP_FOWNER", "CAP_DAC_OVERRIDE"],
            "SecurityOpt": ["no-new-privileges:true"],
            "Memory": settings.memory_bytes,
            "MemorySwap": settings.memory_bytes,
            "PidsLimit": 64,
            "Mounts": [
                {
                    "Type": "volume",
                    "Source": prep_volume,
                    "Target": PREP_TARGET,
                    "ReadOnly": False,
                    "VolumeOptions": {"NoCopy": True},
                }
            ],
            "AutoRemove": False,
            "LogConfig": {"Type": "none", "Config": {}},
        },
    }
