"""The bounded-agent ``sbx`` capability report: per capability, never a pass (spec 15.7).

Theory of operation: an enclave needs controls that the audited Docker
Sandboxes CLI (``sbx`` v0.37.1) does not have -- above all a mandatory
network policy that lets the enclave reach exactly one peer, the API proxy
(an advisory ``HTTP_PROXY`` variable is not one), plus PID, disk and
per-file size limits and a digest-pinned enclave bootstrap. So
``boundedAgents.runtime: "sbx"`` is accepted by the schema and refused by the
preflight before anything is staged, with this report: one entry per
capability (what the enclave needs, whether the audited release has it, why
not), ``supported`` computed from the entries and therefore never true while
one required capability is missing -- and one is always missing, because the
missing list is fixed data of the audited release, not something a probe can
promote (the "no false pass" design of spec 15.7).

:func:`observe_sbx` is the thin I/O layer: it only asks an ``sbx`` binary on
``PATH`` for its version (no mutating or authenticated call), so the
operator sees which release is installed next to the audited one;
:func:`enclave_sbx_report` is pure.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bounded_query.broker.protocol.policy import RUNTIME_SBX, SUBSYSTEM_AGENT
from bounded_query.sandbox.sbx import AUDITED_SBX_VERSION

__all__ = [
    "ENCLAVE_CAPABILITIES",
    "SbxObservation",
    "enclave_sbx_report",
    "observe_sbx",
]

#: How long ``sbx version`` may take (a local CLI answering its version).
SBX_VERSION_TIMEOUT_S = 5.0
#: At most this much of its output is kept (a version line is short).
SBX_VERSION_MAX_CHARS = 200

#: (capability, whether the audited release has it, what it offers or lacks).
#: Every one is required by an enclave (spec 15.5, 15.6, 15.7).
ENCLAVE_CAPABILITIES: tuple[tuple[str, bool, str], ...] = (
    ("create-name-cpus-memory", True, "sbx create --name --cpus --memory"),
    ("read-only-mounts", True, "read-only same-path mounts"),
    ("exec-user-workdir", True, "sbx exec --user --workdir"),
    ("stop-and-force-remove", True, "sbx stop, sbx rm --force"),
    (
        "api-proxy-only-network",
        False,
        "no enforceable, mandatory policy that lets the sandbox reach exactly the API proxy"
        " (an advisory HTTP_PROXY variable is not a network policy)",
    ),
    ("pids-limit", False, "no per-sandbox PID limit"),
    ("disk-limit", False, "no per-sandbox disk quota (the /tmp and /agent tmpfs bounds)"),
    ("file-size-limit", False, "no per-file size limit (RLIMIT_FSIZE)"),
    ("mount-target", False, "no guest mount target (the seed must appear at /awf/seed)"),
    (
        "pinned-enclave-template",
        False,
        "no digest-pinned, standard-library-only bounded-agent template or bootstrap",
    ),
)


@dataclass(frozen=True, slots=True)
class SbxObservation:
    """What the host shows of ``sbx``: the binary (or None) and its version line."""

    binary: str | None = None
    version: str | None = None
    error: str | None = None


def enclave_sbx_report(observation: SbxObservation) -> dict[str, Any]:
    """The structured capability report for ``boundedAgents.runtime: "sbx"``.

    Returns a JSON-serializable dict: ``runtime``, ``subsystem``,
    ``auditedVersion``, ``installed`` (``binary``, ``version``, ``error``),
    ``capabilities`` (one ``{"capability", "required", "available",
    "detail"}`` per capability), ``missing`` (the names), ``supported``
    (False whenever one is missing: always, for the audited release),
    ``fallback`` ("never").
    """
    capabilities = [
        {"capability": name, "required": True, "available": available, "detail": detail}
        for name, available, detail in ENCLAVE_CAPABILITIES
    ]
    missing = [c["capability"] for c in capabilities if c["required"] and not c["available"]]
    installed: Mapping[str, str | None] = {
        "binary": observation.binary,
        "version": observation.version,
        "error": observation.error,
    }
    return {
        "runtime": RUNTIME_SBX,
        "subsystem": SUBSYSTEM_AGENT,
        "auditedVersion": AUDITED_SBX_VERSION,
        "installed": dict(installed),
        "capabilities": capabilities,
        "missing": missing,
        "supported": not missing,
        "fallback": "never",
    }


def observe_sbx(path: str | None = None) -> SbxObservation:
    """Ask an ``sbx`` on ``PATH`` (or ``path``) for its version; never fails (blocking)."""
    binary = shutil.which("sbx", path=path)
    if binary is None:
        return SbxObservation()
    try:
        done = subprocess.run(
            [binary, "version"],
            capture_output=True,
            text=True,
            timeout=SBX_VERSION_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return SbxObservation(binary, None, type(exc).__name__)
    line = (done.stdout.strip().splitlines() or [""])[0][:SBX_VERSION_MAX_CHARS]
    if done.returncode != 0:
        return SbxObservation(binary, line or None, f"exit status {done.returncode}")
    return SbxObservation(binary, line or None)
