"""Which runs may mix unmetered and metered repositories (README "Residual channels").

Theory of operation: spec 14.10 bounds what an invocation discloses by its
own charge. A later query on a ``public`` repository is unmetered, so any
state an earlier metered query (``internal`` or ``confidential``) can leave
in the kernel, and the public query can read, carries bits out for free.
Per-invocation storage, masked ``/proc``/``/sys`` paths and the seccomp
profile close what they can (sandbox/storage.py, sandbox/spec.py,
seccomp/). What remains on runc is the host kernel's own global state that
no mount, mask or syscall filter takes away from python3 and git: pipe,
socket and other pseudo-file-system inode numbers come from one kernel-wide
counter, and so on (the README lists each channel with its measured
capacity). gVisor gives every sandbox its own kernel, so those counters
start afresh for each query.

Policy:

* a run whose repositories are all metered, or all public, has nothing to
  protect from this: accepted as is (metered queries only ever answer
  through their own charge; between public repositories nothing is secret);
* a run that mixes ``public`` with metered repositories is accepted on
  ``gvisor`` when the broker can give each invocation its own storage;
* otherwise (runtime ``docker``, i.e. runc, or no per-invocation storage
  because the harness is not root) it is refused by preflight, with the fix:
  use ``runtime: gvisor``, split the run, or pass the explicit operator flag
  ``--allow-runc-mixed-sensitivity``, which accepts it *degraded* (a
  ``degraded`` JSONL event and the step summary's notice name the open
  channels).

``sealed`` repositories never run a query (budget 0, every charge is at
least one bit), so they count as neither. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bounded_query.broker.protocol import policy

from .config import Problem

__all__ = [
    "ALLOW_FLAG",
    "ChannelDecision",
    "channel_decision",
    "mixes_sensitivity",
]

#: The operator flag that accepts a mixed run where channels stay open.
ALLOW_FLAG = "--allow-runc-mixed-sensitivity"
#: What stays open on runc, for the notice (README "Residual channels").
RUNC_CHANNELS = ("the host kernel's pipe, socket and anonymous-inode number counter",)
#: What stays open without per-invocation storage.
SHARED_STORAGE_CHANNELS = ("the shared workspace tmpfs's inode counter and free space",)


@dataclass(frozen=True, slots=True)
class ChannelDecision:
    """The verdict: a preflight problem (refused), a degraded notice, or neither."""

    problem: Problem | None = None
    degraded: str | None = None

    def __post_init__(self) -> None:
        if self.problem is not None and self.degraded is not None:
            raise ValueError("a refused run has no degraded notice")


def mixes_sensitivity(sensitivities: Iterable[str]) -> bool:
    """True when the run has a ``public`` repository and a metered one that can run queries."""
    classes = set(sensitivities)
    metered = {s for s in classes if (policy.RUN_BUDGETS.get(s) or 0) > 0}
    return "public" in classes and bool(metered)


def channel_decision(
    runtime: str,
    sensitivities: Iterable[str],
    *,
    isolated_storage: bool,
    allow_mixed: bool,
) -> ChannelDecision:
    """Apply the policy of the module docstring.

    ``isolated_storage``: the broker can mount each invocation's own tmpfs
    (it runs as root, on the host or as the compose service).
    ``allow_mixed``: the operator passed :data:`ALLOW_FLAG`.
    """
    if not mixes_sensitivity(sensitivities):
        return ChannelDecision()
    open_channels: tuple[str, ...] = ()
    if runtime != policy.RUNTIME_GVISOR:
        open_channels += RUNC_CHANNELS
    if not isolated_storage:
        open_channels += SHARED_STORAGE_CHANNELS
    if not open_channels:
        return ChannelDecision()
    where = policy.OCI_RUNC if runtime != policy.RUNTIME_GVISOR else "this host"
    listed = "; ".join(open_channels)
    if allow_mixed:
        return ChannelDecision(
            degraded=f"public and metered repositories share one run on {where} ({ALLOW_FLAG}):"
            f" a later public answer can carry bits a metered query left in {listed}"
        )
    return ChannelDecision(
        problem=Problem(
            "boundedQueries.privateRepos",
            f"public and metered repositories in one run on {where}: a later unmetered public"
            f" answer could carry bits an earlier metered query left in {listed}",
            'use runtime "gvisor" (as root), put public repositories in a separate run, or'
            f" accept it degraded with {ALLOW_FLAG}",
        )
    )
