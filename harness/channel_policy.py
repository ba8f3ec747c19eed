"""Which runs may share the host between repositories (README "Residual channels").

Theory of operation: spec 14.10 bounds what an invocation discloses about a
repository by that repository's own charge: a ``confidential`` repository
gives away at most 8 bits in a run, whatever the agent does. A
cross-invocation channel -- kernel state one query leaves and a later query
reads -- breaks that promise as soon as the later query belongs to *another*
repository: the earlier query's secret then leaves through the later
repository's answers, charged to the wrong budget (a ``public`` repository
charges nothing; an ``internal`` one 64 bits, eight times a confidential
budget; two ``internal`` repositories spend each other's). Between the
invocations of one repository such a channel costs nothing extra: whatever
crosses leaves through that repository's own charge.

Per-invocation storage, masked ``/proc``/``/sys`` paths, the seccomp
profile and the page-cache pin close what they can (sandbox/storage.py,
sandbox/spec.py, seccomp/, sandbox/pagecache.py). What stays open, by input:

* ``runtime`` ``docker`` (runc): the host kernel's pipe, socket and
  anonymous-inode number counter (2.04 bits per trial measured; gVisor gives
  every sandbox its own kernel);
* ``isolated_storage`` False (the harness, hence the broker, is not root):
  the shared workspace file system's inode counter and free space (4 bits
  per trial);
* ``pinned`` False (the page-cache pin did not start, or the readiness file
  could not be read): the image's page-cache residency (3.1 bits per trial
  on runc, 1.05 on gVisor).

Policy: a run *shares the host* when more than one of its repositories can
run queries (``public`` or a positive budget; ``sealed`` never runs one) and
at least one of them is metered (between public repositories nothing is
secret). A sharing run with any channel open is refused (before staging for
the first two inputs, before the agent starts for the pin, which is known
only once the broker is ready), with the fix: ``runtime: gvisor`` as root,
one repository per run, or the operator flag :data:`ALLOW_FLAG`, which
accepts it *degraded* (a ``degraded`` JSONL event and the step summary's
notice name the open channels). Every other run is accepted as is. The flag
replaces ``--allow-runc-mixed-sensitivity`` (:data:`REMOVED_FLAG`), which
named neither the two-metered case nor gVisor without root or pin; the old
name is refused with a message naming the new one.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bounded_query.broker.protocol import policy
from bounded_query.broker.runner import PAGE_CACHE_PIN, Degradation

from .config import Problem

__all__ = [
    "ALLOW_FLAG",
    "NON_ROOT_MISSING",
    "REMOVED_FLAG",
    "ChannelDecision",
    "channel_decision",
    "pin_missing",
    "shares_host",
]

#: The operator flag that accepts a sharing run where channels stay open.
ALLOW_FLAG = "--allow-cross-invocation-channels"
#: Its former name, refused with a hint naming :data:`ALLOW_FLAG`.
REMOVED_FLAG = "--allow-runc-mixed-sensitivity"
#: What stays open on runc, for the notice (README "Residual channels").
RUNC_CHANNELS = ("the host kernel's pipe, socket and anonymous-inode number counter",)
#: What stays open without per-invocation storage.
SHARED_STORAGE_CHANNELS = ("the shared workspace tmpfs's inode counter and free space",)
#: What stays open without the page-cache pin.
UNPINNED_CHANNELS = ("the page-cache residency of the query image's files",)
#: What a non-root harness lacks (a ``degraded`` event of its own).
NON_ROOT_MISSING = Degradation(
    "per-invocation storage",
    "the harness is not root: the broker cannot mount each invocation's own tmpfs"
    " workspace, so queries share the workspace file system's inode counter and free"
    " space, a cross-invocation channel (a run with several repositories that run"
    f" queries is refused unless {ALLOW_FLAG}); run the harness as root",
)


@dataclass(frozen=True, slots=True)
class ChannelDecision:
    """The verdict: a preflight problem (refused), a degraded notice, or neither."""

    problem: Problem | None = None
    degraded: str | None = None

    def __post_init__(self) -> None:
        if self.problem is not None and self.degraded is not None:
            raise ValueError("a refused run has no degraded notice")


def _can_query(sensitivity: str) -> bool:
    return (
        sensitivity == policy.SENSITIVITY_PUBLIC or (policy.RUN_BUDGETS.get(sensitivity) or 0) > 0
    )


def shares_host(sensitivities: Iterable[str]) -> bool:
    """True when more than one repository can run queries and one of them is metered.

    ``sensitivities`` has one entry per configured repository (two
    ``internal`` repositories are two entries).
    """
    queryable = [s for s in sensitivities if _can_query(s)]
    return len(queryable) > 1 and any(s != policy.SENSITIVITY_PUBLIC for s in queryable)


def pin_missing(degraded: Iterable[Degradation]) -> bool:
    """Whether the broker's readiness announcements leave the page cache unpinned.

    Fail closed: an unreadable readiness file (``subsystem`` ``broker``,
    ``broker/readiness.py``) may have listed the pin, so it counts as missing.
    """
    return any(d.subsystem in (PAGE_CACHE_PIN, "broker") for d in degraded)


def channel_decision(
    runtime: str,
    sensitivities: Iterable[str],
    *,
    isolated_storage: bool,
    allow_open: bool,
    pinned: bool = True,
) -> ChannelDecision:
    """Apply the policy of the module docstring.

    ``isolated_storage``: the broker can mount each invocation's own tmpfs
    (it runs as root, on the host or as the compose service).
    ``pinned``: the page-cache pin runs (preflight, before the broker
    exists, assumes it will; the harness asks again with the readiness
    file's answer). ``allow_open``: the operator passed :data:`ALLOW_FLAG`.
    """
    if not shares_host(sensitivities):
        return ChannelDecision()
    open_channels: tuple[str, ...] = ()
    if runtime != policy.RUNTIME_GVISOR:
        open_channels += RUNC_CHANNELS
    if not isolated_storage:
        open_channels += SHARED_STORAGE_CHANNELS
    if not pinned:
        open_channels += UNPINNED_CHANNELS
    if not open_channels:
        return ChannelDecision()
    where = policy.OCI_RUNC if runtime != policy.RUNTIME_GVISOR else "this host"
    listed = "; ".join(open_channels)
    if allow_open:
        return ChannelDecision(
            degraded=f"several repositories share one run on {where} ({ALLOW_FLAG}): a later"
            f" answer of one repository can carry bits an earlier query of another left in"
            f" {listed}, charged to the wrong budget (or to none, for a public repository)"
        )
    return ChannelDecision(
        problem=Problem(
            "boundedQueries.privateRepos",
            f"several repositories that run queries, one of them metered, share one run on"
            f" {where}: a later answer of one repository could carry bits an earlier query"
            f" of another left in {listed}, so a budget would not bound what its own"
            " repository discloses",
            'use runtime "gvisor" (as root, with the page-cache pin), put each metered'
            f" repository in a run of its own, or accept it degraded with {ALLOW_FLAG}",
        )
    )
