"""Real-clock timing benchmark of the broker pipeline (spec 14.3.1; issue #3).

Runs invocations of varying durations through the real pipeline (journal with
fsync, workspace, result file, strict output check, cleanup, staged bucket
wait) with the in-process scripted fake runner, and prints for each answer
its offset from the boundary it landed on and the broker's own overhead
(lane time minus runner time). All offsets should be within the 5 ms
tolerance and every answer on the expected boundary.

    python tests/bench/bench_timing.py            # 100 invocations, ~2 minutes
    python tests/bench/bench_timing.py --long     # adds 60 s and 600 s waits (~12 min)

A table, never an assertion: the exit code is 0 unless the broker breaks.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
from pathlib import Path

import trio

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from bounded_query.broker.accounts import Accounts  # noqa: E402
from bounded_query.broker.audit import AuditLog  # noqa: E402
from bounded_query.broker.journal import JournalFile  # noqa: E402
from bounded_query.broker.ledger import Ledger  # noqa: E402
from bounded_query.broker.runner import Invocation, RunReport  # noqa: E402
from bounded_query.broker.service import Service  # noqa: E402
from bounded_query.broker.timing import TOLERANCE_S, choose_boundary  # noqa: E402
from tests.broker.helpers import load, make_root, request_bytes  # noqa: E402
from tests.broker.test_service_timing import _http  # noqa: E402
from tests.fakes.runner import ScriptedRunner  # noqa: E402


class TimedRunner(ScriptedRunner):
    """The scripted fake, also recording how long each run took."""

    def __init__(self) -> None:
        super().__init__()
        self.last_run_s = 0.0

    async def run(self, invocation: Invocation) -> RunReport:
        start = trio.current_time()
        try:
            return await super().run(invocation)
        finally:
            self.last_run_s = trio.current_time() - start


def durations(long: bool) -> list[float]:
    rng = random.Random(14_3_1)
    out: list[float] = []
    # Spread over the 10 ms .. 10 s buckets, with values hugging boundaries.
    for low, high, count in [(0.0, 0.008, 30), (0.012, 0.09, 30), (0.11, 0.9, 30)]:
        out += [rng.uniform(low, high) for _ in range(count)]
    out += [0.0095, 0.0995, 0.995, 0.0, 0.05, 0.5, 1.5, 2.0, 5.0, 9.9]
    if long:
        out += [55.0, 590.0]
    return out


async def main(long: bool) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-timing-") as tmp:
        config, seed_map = load(make_root(Path(tmp), max_invocations=10000, timeout=540))
        journal = JournalFile.open(config.journal_path, config.run_id)
        audit = AuditLog(config.audit_path)
        runner = TimedRunner()
        accounts = Accounts(journal, Ledger(), config.max_invocations)
        service = Service(config, seed_map, runner, accounts, audit)
        rows = []
        for duration in durations(long):
            sent: list[float] = []

            async def send(body: bytes, sent: list[float] = sent) -> None:
                sent.append(trio.current_time())

            raw = request_bytes(f"sleep {duration}\nwrite true")
            await service.handle(_http(raw), send)
            assert service.last_timing is not None
            start, processed, landing = service.last_timing
            elapsed = sent[0] - start
            boundary = landing.boundary_s if landing else float("nan")
            expected = service.boundaries_s[choose_boundary(processed - start)]
            overhead = processed - start - runner.last_run_s
            rows.append((duration, boundary, expected, elapsed - boundary, overhead))
        journal.close()
        audit.close()
    print(f"{'runner s':>10} {'bucket s':>9} {'expected':>9} {'offset ms':>10} {'overhead ms':>12}")
    for duration, boundary, expected, offset, overhead in rows:
        flag = "" if abs(offset) <= TOLERANCE_S and boundary == expected else "  <-- MISS"
        print(
            f"{duration:10.4f} {boundary:9.3f} {expected:9.3f} {offset * 1e3:10.3f} "
            f"{overhead * 1e3:12.3f}{flag}"
        )
    offsets = [abs(r[3]) * 1e3 for r in rows]
    overheads = [r[4] * 1e3 for r in rows]
    misses = sum(1 for r in rows if abs(r[3]) > TOLERANCE_S or r[1] != r[2])
    print()
    print(f"invocations            {len(rows)}")
    print(f"on expected boundary   {len(rows) - misses}/{len(rows)} (tolerance 5 ms)")
    print(f"|offset| median / max  {statistics.median(offsets):.3f} / {max(offsets):.3f} ms")
    print(
        f"overhead median / p95 / max  {statistics.median(overheads):.2f} / "
        f"{sorted(overheads)[int(len(overheads) * 0.95)]:.2f} / {max(overheads):.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main, "--long" in sys.argv[1:]))
