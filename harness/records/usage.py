"""Per-repository usage and the Markdown step summary (seed 000 8.5.3, 11.4).

Pure: :func:`usage_from_state` folds the broker's journal with the broker's
own ledger (``broker/ledger.py``: the repository and debit of every accepted
invocation, and a category for every refusal it counted) and joins it with
its protected audit log (each response's
timing bucket, category and, when the request named a configured slug, its
repository) on the invocation id. Every counted response is then explained
: launched ones under their repository, refusals under the
repository they named or as *not attributable* (an invalid or unconfigured
repository, a malformed frame), and answers past the cap from the audit's
refusal summaries.

:func:`render_summary` turns the result into GitHub-flavored Markdown (an h3
heading, a visible degraded-mode notice, the per-repository table, and
every response inside ``<details>``), never longer than
:data:`MAX_SUMMARY_BYTES` however many invocations ran: the per-response
rows stop at a byte budget with a line saying how many were left out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bounded_query.broker.audit import AuditRecord, RefusalSummary, parse_line
from bounded_query.broker.journal import JournalCorrupt, decode_journal
from bounded_query.broker.ledger import Ledger
from bounded_query.broker.protocol import policy
from bounded_query.broker.timing import bucket_label

__all__ = [
    "MAX_SUMMARY_BYTES",
    "NOT_ATTRIBUTABLE",
    "RepoUsage",
    "Response",
    "RunUsage",
    "render_summary",
    "usage_from_state",
]

#: GitHub refuses a step summary over 1 MiB; ours stays well below it.
MAX_SUMMARY_BYTES = 1024 * 1024 - 64 * 1024
#: The row label of counted refusals that name no configured repository.
NOT_ATTRIBUTABLE = "not attributable"
#: What an invocation without an audit line reads as (its outcome unknown).
_UNAUDITED = AuditRecord("-", "unknown")


@dataclass(frozen=True, slots=True)
class RepoUsage:
    """What one repository spent in this run."""

    repo: str
    sensitivity: str
    spent_bits: int
    invocations: int
    buckets: dict[int, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    #: Counted refusals (before launch) that named this repository, by category.
    refusals: dict[str, int] = field(default_factory=dict)

    @property
    def budget(self) -> int | None:
        """The run budget in bits, None when unmetered."""
        return policy.RUN_BUDGETS.get(self.sensitivity)


@dataclass(frozen=True, slots=True)
class Response:
    """One counted response, as the operator's view lists it."""

    invocation_id: str
    repo: str | None
    category: str
    charge: int | None
    bucket_ms: int | None


@dataclass(frozen=True, slots=True)
class RunUsage:
    """Usage of every configured repository plus the refused requests.

    ``refused``/``refusals``: every counted refusal (any repository);
    ``unattributed``: those naming no configured repository; ``uncounted``:
    answers past the cap (or after a halt), from the audit's summaries;
    ``responses``: every counted response in journal order.
    """

    repos: tuple[RepoUsage, ...]
    refused: int
    refusals: dict[str, int]
    notes: tuple[str, ...] = ()
    unattributed: dict[str, int] = field(default_factory=dict)
    uncounted: dict[str, int] = field(default_factory=dict)
    responses: tuple[Response, ...] = ()


def _audit_records(lines: Iterable[bytes]) -> tuple[dict[str, AuditRecord], Counter[str]]:
    """Audit answers by invocation id, and the summed counts of refusal summaries."""
    out: dict[str, AuditRecord] = {}
    uncounted: Counter[str] = Counter()
    for line in lines:
        record = parse_line(line)
        if isinstance(record, RefusalSummary):
            for category, n in record.counts:
                uncounted[category] += n
        elif isinstance(record, AuditRecord):
            out[record.invocation_id] = record
    return out, uncounted


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def usage_from_state(
    repos: Sequence[tuple[str, str]], journal: bytes | None, audit: bytes | None
) -> RunUsage:
    """Usage per configured ``(repo, sensitivity)`` from the raw journal and audit bytes."""
    notes: list[str] = []
    ledger = Ledger()
    if journal is None:
        notes.append("the broker journal is missing; spent bits are unknown")
    else:
        try:
            # The broker's own fold: a journal it would refuse to start on
            # (corrupt, or records that cannot follow each other) is unreadable.
            ledger = Ledger.from_records(decode_journal(journal).records)
        except JournalCorrupt as exc:
            notes.append(f"the broker journal is unreadable ({exc})")
    audit_by_id, uncounted = _audit_records((audit or b"").splitlines())
    if audit is None:
        notes.append("the audit log is missing; timing buckets are unknown")
    spelling = {repo.lower(): repo for repo, _ in repos}
    repo_of: dict[str, str] = {}
    spent = ledger.spent_by_repo()
    invocations: Counter[str] = Counter()
    refusals: Counter[str] = Counter()
    refused_by_repo: dict[str, Counter[str]] = {}
    unattributed: Counter[str] = Counter()
    responses: list[Response] = []
    for record in ledger.admissions():
        audited = audit_by_id.get(record.invocation_id, _UNAUDITED)
        if record.repo is None:
            category = record.rejection or "refused"
            refusals[category] += 1
            key = audited.repo.lower() if audited.repo is not None else None
            if key is not None and key in spelling:
                refused_by_repo.setdefault(key, Counter())[category] += 1
            else:
                key = None
                unattributed[category] += 1
            responses.append(
                Response(
                    record.invocation_id,
                    None if key is None else spelling[key],
                    category,
                    audited.charge,
                    audited.bucket_ms,
                )
            )
        else:
            key = record.repo.lower()
            repo_of[record.invocation_id] = key
            invocations[key] += 1
            responses.append(
                Response(
                    record.invocation_id,
                    spelling.get(key, record.repo),
                    audited.category,
                    record.charge,
                    audited.bucket_ms,
                )
            )
    buckets: dict[str, Counter[int]] = {}
    outcomes: dict[str, Counter[str]] = {}
    for invocation_id, audited in audit_by_id.items():
        owner = repo_of.get(invocation_id)
        if owner is None:
            continue
        if audited.bucket_ms is not None:
            buckets.setdefault(owner, Counter())[audited.bucket_ms] += 1
        outcomes.setdefault(owner, Counter())[audited.category] += 1
    usage = tuple(
        RepoUsage(
            repo=repo,
            sensitivity=sensitivity,
            spent_bits=spent.get(repo.lower(), 0),
            invocations=invocations[repo.lower()],
            buckets=dict(sorted(buckets.get(repo.lower(), Counter()).items())),
            outcomes=dict(sorted(outcomes.get(repo.lower(), Counter()).items())),
            refusals=dict(sorted(refused_by_repo.get(repo.lower(), Counter()).items())),
        )
        for repo, sensitivity in repos
    )
    return RunUsage(
        usage,
        sum(refusals.values()),
        dict(sorted(refusals.items())),
        tuple(notes),
        unattributed=dict(sorted(unattributed.items())),
        uncounted=dict(sorted(uncounted.items())),
        responses=tuple(responses),
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name}: {n}" for name, n in counts.items()) or "—"


def render_summary(
    usage: RunUsage,
    *,
    exit_code: int,
    runtime: str,
    degraded: Sequence[str] = (),
    max_bytes: int = MAX_SUMMARY_BYTES,
    title: str = "Bounded queries",
    extra: Sequence[str] = (),
) -> str:
    """The step summary Markdown (seed 000 8.5.3; degraded notice per 11.4 item 4).

    At most ``max_bytes`` UTF-8 bytes: the per-response rows inside
    ``<details>`` stop at the budget, with a line counting the rest.
    ``title`` names the subsystem (the bounded-agent section passes its
    own, spec 15.1); ``extra`` lines follow the totals (its API-proxy usage).
    """
    lines = [f"### {title} — runtime `{runtime}`, exit {exit_code}", ""]
    notices = [*degraded, *usage.notes]
    if notices:
        lines += ["> [!WARNING]", "> **Degraded mode** — some data below may be incomplete:"]
        lines += [f"> - {_cell(note)}" for note in notices[:50]]
        if len(notices) > 50:
            lines.append(f"> - … and {len(notices) - 50} more notices")
        lines.append("")
    lines += [
        "| Repository | Sensitivity | Budget (bits) | Spent (bits) | Invocations | Buckets"
        " | Outcomes | Refused |",
        "|---|---|---:|---:|---:|---|---|---|",
    ]
    for repo in usage.repos:
        budget = "unmetered" if repo.budget is None else str(repo.budget)
        buckets = ", ".join(f"{bucket_label(ms)}: {n}" for ms, n in repo.buckets.items()) or "—"
        lines.append(
            f"| `{_cell(repo.repo)}` | {repo.sensitivity} | {budget} | {repo.spent_bits} |"
            f" {repo.invocations} | {_cell(buckets)} | {_cell(_counts(repo.outcomes))} |"
            f" {_cell(_counts(repo.refusals))} |"
        )
    if usage.unattributed:
        lines.append(f"| *{NOT_ATTRIBUTABLE}* | | | | | | | {_cell(_counts(usage.unattributed))} |")
    total_spent = sum(r.spent_bits for r in usage.repos)
    total_inv = sum(r.invocations for r in usage.repos)
    lines.append(
        f"| **Total** | | | **{total_spent}** | **{total_inv}** | | | **{usage.refused}** |"
    )
    lines.append("")
    if extra:
        lines += [*extra, ""]
    if usage.refused:
        reasons = _counts(usage.refusals)
        lines += [f"Refused before launch (any repository): {usage.refused} ({reasons}).", ""]
    if usage.uncounted:
        total = sum(usage.uncounted.values())
        lines += [
            f"Answered with the canonical error without being counted (past `maxInvocations`"
            f" or after a halt): {total} ({_counts(usage.uncounted)}).",
            "",
        ]
    text = "\n".join(lines)
    if not usage.responses:
        return text
    head = [
        "<details>",
        f"<summary>Every counted response ({len(usage.responses)})</summary>",
        "",
        "| Invocation | Repository | Category | Charge (bits) | Bucket |",
        "|---|---|---|---:|---|",
    ]
    tail = ["", "</details>", ""]
    room = max_bytes - len(text.encode()) - len("\n".join(head + tail).encode()) - 200
    rows: list[str] = []
    for shown, response in enumerate(usage.responses):
        named = f"`{_cell(response.repo)}`" if response.repo else f"*{NOT_ATTRIBUTABLE}*"
        charge = "—" if response.charge is None else str(response.charge)
        bucket = "—" if response.bucket_ms is None else bucket_label(response.bucket_ms)
        row = (
            f"| `{_cell(response.invocation_id)}` | {named} | {_cell(response.category)} |"
            f" {charge} | {bucket} |"
        )
        room -= len(row.encode()) + 1
        if room < 0:
            rest = len(usage.responses) - shown
            rows += ["", f"… and {rest} more responses (the summary's size limit)."]
            break
        rows.append(row)
    return "\n".join([text, *head, *rows, *tail])
