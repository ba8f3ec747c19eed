"""Refusal flood and refusal clock benchmark against a real broker process (issue 9, parts 4/5).

Starts the broker (tests-only entry point, subprocess fake runner) twice:

1. **Flood**: ``maxInvocations`` 1, one valid request, then 10,000 malformed
   requests past the cap (32 at a time) and 200 well-formed ones; prints the
   audit and journal bytes the flood cost (after a SIGTERM, so the shutdown
   summary is included) and whether the broker still answered at once.
2. **Refusal clock**: the latency of malformed-request refusals, sent one
   after another, while the broker is idle and while a query runs (a fake
   query that burns CPU and creates files for about 0.8 s, bucketed to 1 s).

    python tests/bench/bench_refusal_flood.py

Tables only, never assertions.
"""

from __future__ import annotations

import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.broker.helpers import make_root, request_bytes  # noqa: E402
from tests.broker.procs import start_broker  # noqa: E402

GARBAGE = b"NOT HTTP AT ALL\r\n\r\n"
OK_SCRIPT = "import os\nopen(os.environ['QUERY_OUT'], 'w').write('true')\n"
BUSY_SCRIPT = (
    "import os, time\n"
    "end = time.monotonic() + 0.8\n"
    "n = 0\n"
    "while time.monotonic() < end:\n"
    "    open(f'f{n % 500}', 'w').close(); n += 1\n"
    "open(os.environ['QUERY_OUT'], 'w').write('true')\n"
)


async def one(sock: str, payload: bytes) -> bytes:
    stream = await trio.open_unix_socket(sock)
    async with stream:
        try:
            await stream.send_all(payload)
            await stream.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        data = b""
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not chunk:
                break
            data += chunk
        return data


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


async def flood() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as tmp:
        doc = make_root(Path(tmp), max_invocations=1)
        config_path = Path(tmp) / "broker.json"
        sock = str(doc["socketPath"])
        private = Path(str(doc["privateRoot"]))
        audit, journal = private / "audit" / "audit.jsonl", private / "state" / "journal"
        proc = start_broker(config_path)
        await one(sock, request_bytes(OK_SCRIPT))
        await trio.sleep(0.5)  # its audit line follows the answer
        audit0, journal0 = _size(audit), _size(journal)
        sem = trio.Semaphore(32)

        async def fire(payload: bytes) -> None:
            async with sem:
                await one(sock, payload)

        start = time.monotonic()
        async with trio.open_nursery() as nursery:
            for _ in range(10_000):
                nursery.start_soon(fire, GARBAGE)
        garbage_s = time.monotonic() - start
        start = time.monotonic()
        async with trio.open_nursery() as nursery:
            for _ in range(200):
                nursery.start_soon(fire, request_bytes(OK_SCRIPT))
        lane_s = time.monotonic() - start
        start = time.monotonic()
        await one(sock, request_bytes(OK_SCRIPT))
        after_ms = (time.monotonic() - start) * 1000
        audit_live = _size(audit) - audit0
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        print("flood: maxInvocations 1, then 10,000 malformed + 200 valid requests past the cap")
        print(f"{'10,000 malformed, wall s':40} {garbage_s:10.2f}")
        print(f"{'200 valid past the cap, wall s':40} {lane_s:10.2f}")
        print(f"{'next request answered after, ms':40} {after_ms:10.1f}")
        print(f"{'audit bytes before SIGTERM':40} {audit_live:10d}")
        print(f"{'audit bytes after SIGTERM':40} {_size(audit) - audit0:10d}")
        print(f"{'journal bytes':40} {_size(journal) - journal0:10d}")


async def latencies(sock: str, count: int, gap_s: float, found: list[float]) -> list[float]:
    for _ in range(count):
        start = time.monotonic()
        await one(sock, GARBAGE)
        found.append((time.monotonic() - start) * 1000)
        await trio.sleep(gap_s)
    return found


def row(name: str, values: list[float]) -> None:
    values = sorted(values)
    q = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else values * 9
    print(
        f"{name:30} {len(values):6d} {values[0]:8.2f} {statistics.median(values):8.2f} "
        f"{q[8]:8.2f} {values[-1]:8.2f}"
    )


async def clock() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-clock-") as tmp:
        doc = make_root(Path(tmp), max_invocations=10_000)
        config_path = Path(tmp) / "broker.json"
        sock = str(doc["socketPath"])
        proc = start_broker(config_path)
        idle = await latencies(sock, 300, 0.002, [])
        during: list[float] = []
        answered: list[float] = []
        for _ in range(3):
            done = trio.Event()
            async with trio.open_nursery() as nursery:

                async def query(done: trio.Event = done) -> None:
                    start = time.monotonic()
                    await one(sock, request_bytes(BUSY_SCRIPT))
                    answered.append(time.monotonic() - start)
                    done.set()

                nursery.start_soon(query)
                await trio.sleep(0.05)
                while not done.is_set():
                    await latencies(sock, 1, 0.002, during)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        print("\nrefusal latency (malformed request, sequential, ms)")
        print(f"{'state':30} {'n':>6} {'min':>8} {'median':>8} {'p90':>8} {'max':>8}")
        row("idle broker", idle)
        row("during a 0.8 s query (x3)", during)
        print(f"query answers (s): {', '.join(f'{a:.3f}' for a in answered)}")


async def main() -> None:
    await flood()
    await clock()


if __name__ == "__main__":
    trio.run(main)
