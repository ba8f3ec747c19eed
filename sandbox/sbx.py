"""The ``sbx`` query backend: accepted by configuration, always blocked (spec 14.2).

Theory of operation: Docker Sandboxes (``sbx``) cannot yet enforce the
isolation controls a query sandbox needs, so selecting ``"runtime": "sbx"``
is an explicit experimental choice that must fail closed: no sandbox is ever
created, nothing falls back to Docker or gVisor, and the operator gets a
structured list of the missing controls. The list is fixed data (the audited
CLI release is named in it); version or help probing alone could never
promote the backend, so this module does not run the CLI at all.
"""

from __future__ import annotations

import json
from typing import Any

from bounded_query.broker.runner import RunnerUnavailable

__all__ = ["AUDITED_SBX_VERSION", "MISSING_CONTROLS", "sbx_capability_report", "sbx_unavailable"]

#: The Docker Sandboxes CLI release whose capabilities were audited (spec 14.2).
AUDITED_SBX_VERSION = "0.37.1"

#: Mandatory isolation controls the audited release cannot enforce.
MISSING_CONTROLS: tuple[tuple[str, str], ...] = (
    (
        "network-none",
        "no enforceable per-VM network=none; local/kit network denies "
        "can be replaced by organization governance",
    ),
    ("pids-limit", "no per-sandbox PID limit"),
    ("disk-limit", "no per-sandbox disk quota"),
    ("file-size-limit", "no per-file size limit (RLIMIT_FSIZE)"),
    ("mount-target", "no explicit guest mount-target control (only same-path mounts)"),
    ("query-template", "no digest-pinned, Python standard-library-only query template"),
)

#: Controls the audited release does offer (listed for the operator).
SUPPORTED_CONTROLS: tuple[str, ...] = (
    "create --name --cpus --memory --template",
    "read-only same-path mounts",
    "exec --user --workdir",
    "ls --json",
    "stop",
    "rm --force",
)


def sbx_capability_report() -> dict[str, Any]:
    """The structured capability report for ``runtime: "sbx"`` (always blocked).

    Returns a JSON-serializable dict: ``runtime``, ``status`` ("blocked"),
    ``launchable`` (False), ``fallback`` ("never"), ``auditedVersion``,
    ``missingControls`` (list of ``{"control", "reason"}``) and
    ``supportedControls``.
    """
    return {
        "runtime": "sbx",
        "status": "blocked",
        "launchable": False,
        "fallback": "never",
        "auditedVersion": AUDITED_SBX_VERSION,
        "missingControls": [{"control": c, "reason": r} for c, r in MISSING_CONTROLS],
        "supportedControls": list(SUPPORTED_CONTROLS),
    }


def sbx_unavailable() -> RunnerUnavailable:
    """The exception ``create_runner`` raises for sbx; its message is the JSON report."""
    return RunnerUnavailable(
        "runtime 'sbx' is blocked (fail-closed preview, spec 14.2): "
        + json.dumps(sbx_capability_report(), sort_keys=True)
    )
