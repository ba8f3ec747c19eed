"""The private root, the ingress root and the overlap check (spec 14.8).

Theory of operation: everything the agent must never see (seeds, seed map,
broker config, control state, journal, audit log, invocation workspaces)
lives below the *private root*
``/var/tmp/awf-bounded-query-private-<uid>-<digest>/``; the only agent-visible
state lives below the disjoint *ingress root*
``/var/tmp/awf-bounded-query-ingress-<uid>-<digest>/`` (``run/`` holds the
socket, ``skill/`` the SKILL.md and the wrapper directory ``skill/bin``).
``<digest>`` is derived from the agent's work directory and the run id, so two
runs never share a root.

With bounded agents enabled (spec 15.1) the run has a second pair of the
same layout, ``awf-bounded-agent-private-<uid>-<digest>`` and
``awf-bounded-agent-ingress-<uid>-<digest>`` (:func:`agent_run_paths`, the
same digest): the agent subsystem's own seeds, seed map, broker config,
journal, audit log and workspaces, plus the API proxy's directory
``proxy/`` (its configuration, the 0400 credential file, the control
socket's directory and the usage records; :attr:`RunPaths.proxy_dir`).
Once staged, the agent private root is 0700: an enclave reaches its seed
only through the bind mount the engine makes, never by traversal.

Before any credential is used, the private root is resolved through its
longest existing ancestor (symlinks followed; the rest of the path appended
lexically) and compared with every agent-visible path resolved the same way:
any containment in either direction is an overlap and fails preflight.

Permissions (the query runs as uid 65534 and reads its seed through a
read-only bind mount): the private root and ``seeds/`` are ``root:65534``
0710 when the harness is root -- traversable by the query's group only,
never listable -- (0711 otherwise), so uid 65534 can reach a seed only by
its unguessable 128-bit name and no other user can traverse at all; every
other entry of the private root is 0700 or 0600. A seed is 0555
directories and 0444/0555 files (see ``staging.py``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "AGENT_INGRESS_PREFIX",
    "AGENT_PRIVATE_PREFIX",
    "DEFAULT_BASE",
    "INGRESS_PREFIX",
    "PRIVATE_PREFIX",
    "PRIVATE_ROOT_MODE",
    "PRIVATE_ROOT_MODE_ROOT",
    "ROOT_PREFIXES",
    "RunPaths",
    "agent_run_paths",
    "overlap_problems",
    "overlaps",
    "resolve_through_ancestor",
    "run_digest",
    "run_paths",
]

DEFAULT_BASE = Path("/var/tmp")
PRIVATE_PREFIX = "awf-bounded-query-private-"
INGRESS_PREFIX = "awf-bounded-query-ingress-"
AGENT_PRIVATE_PREFIX = "awf-bounded-agent-private-"
AGENT_INGRESS_PREFIX = "awf-bounded-agent-ingress-"
#: Both subsystems' (private, ingress) prefixes: the sweep and the reaper
#: treat every pair alike.
ROOT_PREFIXES: tuple[tuple[str, str], ...] = (
    (PRIVATE_PREFIX, INGRESS_PREFIX),
    (AGENT_PRIVATE_PREFIX, AGENT_INGRESS_PREFIX),
)
#: Traversable but not listable by others: uid 65534 must reach its seed.
#: Used when the harness is not root.
PRIVATE_ROOT_MODE = 0o711
#: As root the private root and ``seeds/`` are ``root:65534`` 0710: only the
#: query's group traverses them, no other user does (a host agent among them).
PRIVATE_ROOT_MODE_ROOT = 0o710
#: Hex digits of the per-run digest in the root names.
DIGEST_CHARS = 16


def run_digest(work_dir: Path, run_id: str) -> str:
    """The ``<digest>`` of the root names: sha256 of the work dir and run id."""
    material = f"{os.path.abspath(work_dir)}\0{run_id}".encode("utf-8", "surrogateescape")
    return hashlib.sha256(material).hexdigest()[:DIGEST_CHARS]


@dataclass(frozen=True, slots=True)
class RunPaths:
    """Every path of one run, derived from the two roots."""

    private_root: Path
    ingress_root: Path

    @property
    def seeds_dir(self) -> Path:
        """``seeds/``: one opaque directory per repository."""
        return self.private_root / "seeds"

    @property
    def seed_map(self) -> Path:
        """The seed map the broker reads (spec 14.6)."""
        return self.private_root / "seed-map.json"

    @property
    def broker_config(self) -> Path:
        """The broker's config file (``bounded-query-broker --config``)."""
        return self.private_root / "broker.json"

    @property
    def ready_file(self) -> Path:
        """Written by the broker once it listens."""
        return self.private_root / "control" / "ready"

    @property
    def audit_log(self) -> Path:
        """The broker's protected audit log."""
        return self.private_root / "audit" / "audit.jsonl"

    @property
    def journal(self) -> Path:
        """The broker's durable accounting journal."""
        return self.private_root / "state" / "journal"

    @property
    def workspaces_dir(self) -> Path:
        """``work/``: the broker's invocation workspaces (the quota tmpfs, ``quota.py``)."""
        return self.private_root / "work"

    @property
    def staging_dir(self) -> Path:
        """Temporary staging HOME and askpass helper (deleted after staging)."""
        return self.private_root / "staging"

    @property
    def socket_dir(self) -> Path:
        """Agent-visible directory holding the broker socket."""
        return self.ingress_root / "run"

    @property
    def socket_path(self) -> Path:
        """The broker's Unix socket."""
        return self.socket_dir / "broker.sock"

    @property
    def skill_dir(self) -> Path:
        """Agent-visible, read-only skill/wrapper directory."""
        return self.ingress_root / "skill"

    @property
    def skill_file(self) -> Path:
        """The generated SKILL.md (spec 14.8)."""
        return self.skill_dir / "SKILL.md"

    @property
    def wrapper_dir(self) -> Path:
        """``bounded-query``, ``bounded-query-cost`` and ``bq_protocol/``."""
        return self.skill_dir / "bin"

    # The API proxy's files (the bounded-agent private root only).

    @property
    def proxy_dir(self) -> Path:
        """``proxy/`` (0700): everything of the run's API proxy (short names: the
        control socket's path must fit ``sun_path``, 108 bytes, under any base)."""
        return self.private_root / "proxy"

    @property
    def proxy_config(self) -> Path:
        """The proxy's configuration (``broker/apiproxy/_config.py``), mounted read-only."""
        return self.proxy_dir / "proxy.json"

    @property
    def proxy_credential(self) -> Path:
        """The real provider credential: 0400, owned by the proxy's uid only."""
        return self.proxy_dir / "credential"

    @property
    def proxy_control_dir(self) -> Path:
        """The control socket's directory: 0700, the proxy's uid (root enters it)."""
        return self.proxy_dir / "control"

    @property
    def proxy_control_socket(self) -> Path:
        """The proxy's control socket (arm/disarm), the agent broker's only."""
        return self.proxy_control_dir / "sock"

    @property
    def usage_dir(self) -> Path:
        """The proxy's usage records (never bodies): ``usage.jsonl``."""
        return self.proxy_dir / "usage"

    @property
    def usage_log(self) -> Path:
        """``usage.jsonl`` of the proxy (``broker/apiproxy/usagelog.py``)."""
        return self.usage_dir / "usage.jsonl"


def run_paths(uid: int, work_dir: Path, run_id: str, base: Path = DEFAULT_BASE) -> RunPaths:
    """Both roots for ``uid``'s run ``run_id`` started from ``work_dir``."""
    suffix = f"{uid}-{run_digest(work_dir, run_id)}"
    return RunPaths(base / f"{PRIVATE_PREFIX}{suffix}", base / f"{INGRESS_PREFIX}{suffix}")


def agent_run_paths(uid: int, work_dir: Path, run_id: str, base: Path = DEFAULT_BASE) -> RunPaths:
    """The bounded-agent roots of the run (same ``<uid>-<digest>`` as :func:`run_paths`)."""
    suffix = f"{uid}-{run_digest(work_dir, run_id)}"
    return RunPaths(
        base / f"{AGENT_PRIVATE_PREFIX}{suffix}", base / f"{AGENT_INGRESS_PREFIX}{suffix}"
    )


def resolve_through_ancestor(path: Path) -> Path:
    """Resolve ``path`` through its longest existing ancestor.

    The existing part is resolved with symlinks followed; the missing tail is
    appended lexically (after making the path absolute and normalizing
    ``.``/``..`` lexically, as nothing below a missing directory can be a
    symlink yet).
    """
    absolute = Path(os.path.normpath(os.path.abspath(path)))
    existing = absolute
    tail: list[str] = []
    while not os.path.lexists(existing) and existing != existing.parent:
        tail.append(existing.name)
        existing = existing.parent
    resolved = existing.resolve(strict=False)
    for part in reversed(tail):
        resolved = resolved / part
    return resolved


def overlaps(a: Path, b: Path) -> bool:
    """True when resolved paths ``a`` and ``b`` are equal or one contains the other."""
    ra, rb = resolve_through_ancestor(a), resolve_through_ancestor(b)
    return ra == rb or ra.is_relative_to(rb) or rb.is_relative_to(ra)


def overlap_problems(private_root: Path, agent_visible: Iterable[Path]) -> list[str]:
    """Describe every agent-visible path that overlaps the private root."""
    problems = []
    resolved_private = resolve_through_ancestor(private_root)
    for visible in agent_visible:
        if overlaps(private_root, visible):
            problems.append(
                f"private root {resolved_private} overlaps agent-visible path "
                f"{visible} (resolves to {resolve_through_ancestor(visible)})"
            )
    return problems
