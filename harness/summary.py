"""Per-repository usage and the Markdown step summary (seed 000 8.5.3, 11.4).

Pure: :func:`usage_from_state` joins the broker's journal (which records the
repository of every accepted invocation and every debit) with its protected
audit log (which records each invocation's timing bucket and outcome category
but, by design, no repository name) on the invocation id.
:func:`render_summary` turns the result into GitHub-flavored Markdown with a
visible degraded-mode notice when anything was degraded.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bounded_query.broker.journal import Admitted, Debit, JournalCorrupt, decode_journal

from .config import RUN_BUDGETS

__all__ = ["RepoUsage", "RunUsage", "render_summary", "usage_from_state"]


@dataclass(frozen=True, slots=True)
class RepoUsage:
    """What one repository spent in this run."""

    repo: str
    sensitivity: str
    spent_bits: int
    invocations: int
    buckets: dict[int, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def budget(self) -> int | None:
        """The run budget in bits, None when unmetered."""
        return RUN_BUDGETS.get(self.sensitivity)


@dataclass(frozen=True, slots=True)
class RunUsage:
    """Usage of every configured repository plus the refused requests."""

    repos: tuple[RepoUsage, ...]
    refused: int
    refusals: dict[str, int]
    notes: tuple[str, ...] = ()


def _audit_records(lines: Iterable[bytes]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("invocationId"), str):
            out[record["invocationId"]] = record
    return out


def usage_from_state(
    repos: Sequence[tuple[str, str]], journal: bytes | None, audit: bytes | None
) -> RunUsage:
    """Usage per configured ``(repo, sensitivity)`` from the raw journal and audit bytes."""
    notes: list[str] = []
    records: tuple[object, ...] = ()
    if journal is None:
        notes.append("the broker journal is missing; spent bits are unknown")
    else:
        try:
            records = decode_journal(journal).records
        except JournalCorrupt as exc:
            notes.append(f"the broker journal is unreadable ({exc})")
    audit_by_id = _audit_records((audit or b"").splitlines())
    if audit is None:
        notes.append("the audit log is missing; timing buckets are unknown")
    repo_of: dict[str, str] = {}
    spent: Counter[str] = Counter()
    invocations: Counter[str] = Counter()
    refusals: Counter[str] = Counter()
    for record in records:
        if isinstance(record, Admitted):
            if record.repo is None:
                refusals[record.rejection or "refused"] += 1
            else:
                key = record.repo.lower()
                repo_of[record.invocation_id] = key
                invocations[key] += 1
        elif isinstance(record, Debit):
            spent[record.repo.lower()] += record.bits
    buckets: dict[str, Counter[int]] = {}
    outcomes: dict[str, Counter[str]] = {}
    for invocation_id, record in audit_by_id.items():
        owner = repo_of.get(invocation_id)
        if owner is None:
            continue
        bucket = record.get("bucketMs")
        if isinstance(bucket, int) and not isinstance(bucket, bool):
            buckets.setdefault(owner, Counter())[bucket] += 1
        category = record.get("category")
        if isinstance(category, str):
            outcomes.setdefault(owner, Counter())[category] += 1
    usage = tuple(
        RepoUsage(
            repo=repo,
            sensitivity=sensitivity,
            spent_bits=spent[repo.lower()],
            invocations=invocations[repo.lower()],
            buckets=dict(sorted(buckets.get(repo.lower(), Counter()).items())),
            outcomes=dict(sorted(outcomes.get(repo.lower(), Counter()).items())),
        )
        for repo, sensitivity in repos
    )
    return RunUsage(usage, sum(refusals.values()), dict(sorted(refusals.items())), tuple(notes))


def _bucket_label(ms: int) -> str:
    return f"{ms // 1000}s" if ms >= 1000 else f"{ms}ms"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_summary(
    usage: RunUsage,
    *,
    exit_code: int,
    runtime: str,
    degraded: Sequence[str] = (),
) -> str:
    """The step summary Markdown (seed 000 8.5.3; degraded notice per 11.4 item 4)."""
    lines = [f"## Bounded queries — runtime `{runtime}`, exit {exit_code}", ""]
    notices = [*degraded, *usage.notes]
    if notices:
        lines += ["> [!WARNING]", "> **Degraded mode** — some data below may be incomplete:"]
        lines += [f"> - {_cell(note)}" for note in notices]
        lines.append("")
    lines += [
        "| Repository | Sensitivity | Budget (bits) | Spent (bits) | Invocations | Buckets"
        " | Outcomes |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for repo in usage.repos:
        budget = "unmetered" if repo.budget is None else str(repo.budget)
        buckets = ", ".join(f"{_bucket_label(ms)}: {n}" for ms, n in repo.buckets.items()) or "—"
        outcomes = ", ".join(f"{name}: {n}" for name, n in repo.outcomes.items()) or "—"
        lines.append(
            f"| `{_cell(repo.repo)}` | {repo.sensitivity} | {budget} | {repo.spent_bits} |"
            f" {repo.invocations} | {_cell(buckets)} | {_cell(outcomes)} |"
        )
    total_spent = sum(r.spent_bits for r in usage.repos)
    total_inv = sum(r.invocations for r in usage.repos)
    lines.append(f"| **Total** | | | **{total_spent}** | **{total_inv}** | | |")
    lines.append("")
    if usage.refused:
        reasons = ", ".join(f"{name}: {n}" for name, n in usage.refusals.items())
        lines += [f"Refused before launch (any repository): {usage.refused} ({reasons}).", ""]
    return "\n".join(lines)
