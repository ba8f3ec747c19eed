"""Live CPU-contention channel, measured with and without the query cpuset (issue 9 part 5).

    flock /tmp/bq-engine.lock python3 tests/bench/bench_contention.py [--trials 8]
        [--runtime docker|gvisor|both]

An encoder query gets a random 16-bit secret and, from an agreed start time
``T0`` (the attacker chooses it and writes it into the script), spends each
100 ms slot either busy (bit 1) or asleep (bit 0): ``cpu`` spins the
interpreter, ``mem`` streams 64 MiB copies (memory bandwidth, shared caches).
The decoder is the agent: busy-loop processes outside the query container,
one pinned to each CPU the agent may use, counting their own progress per
slot; a bit decodes as 1 when the progress in its slot is below the median.

* ``shared``: no cpuset (the state before issue 9); the agent may use every
  CPU, so it runs one decoder per CPU;
* ``cpuset``: queries on ``sandbox.cpus.query_cpus``, the agent confined to
  ``agent_cpus`` (one decoder per agent CPU).

Prints correct bits against chance and the capacity (bits per 16-bit
trial, binary symmetric channel). Tables only, never assertions.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bounded_query.broker.protocol import policy
from bounded_query.broker.workspace import remove_tree
from bounded_query.sandbox import DockerRunner, spec
from bounded_query.sandbox.cpus import agent_cpus
from tests.sandbox.helpers import make_seed, new_invocation, remove_seed, settings

BITS = 16
SLOT_S = 0.1
LEAD_S = 2.5  # container start (runsc ~0.6 s) plus margin

ENCODER = r"""
import time
T0, SECRET, SLOT, KIND = __T0__, __SECRET__, __SLOT__, "__KIND__"
buf = bytearray(64 << 20)
while time.time() < T0:
    time.sleep(0.001)
for i in range(__BITS__):
    end = T0 + (i + 1) * SLOT
    if SECRET >> i & 1:
        while time.time() < end:
            if KIND == "mem":
                bytes(buf)
            else:
                for _ in range(1000):
                    pass
    else:
        time.sleep(max(0.0, end - time.time()))
open("/query/out", "w").write("true")
"""


def _decoder(cpu: int, t0: float, out: multiprocessing.Queue) -> None:
    os.sched_setaffinity(0, {cpu})
    counts = [0] * BITS
    end = t0 + BITS * SLOT_S
    now = time.time()
    while now < end:
        for _ in range(2000):
            pass
        now = time.time()
        slot = int((now - t0) / SLOT_S)
        if 0 <= slot < BITS:
            counts[slot] += 1
    out.put(counts)


def _expand(cpus: str) -> list[int]:
    first, _, last = cpus.partition("-")
    return list(range(int(first), int(last or first) + 1))


async def _trial(runner: DockerRunner, work: Path, seed: Path, kind: str, cpus: list[int]):
    secret = secrets.randbits(BITS)
    t0 = math.ceil(time.time() + LEAD_S)
    script = (
        ENCODER.replace("__T0__", str(t0))
        .replace("__SECRET__", str(secret))
        .replace("__SLOT__", str(SLOT_S))
        .replace("__KIND__", kind)
        .replace("__BITS__", str(BITS))
    )
    queue: multiprocessing.Queue = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_decoder, args=(c, t0, queue)) for c in cpus]
    for p in procs:
        p.start()
    inv = new_invocation(runner.settings, work, seed, script)
    report = await runner.run(inv)
    counts = [0] * BITS
    for _ in procs:
        got = await trio.to_thread.run_sync(queue.get)
        counts = [a + b for a, b in zip(counts, got, strict=True)]
    for p in procs:
        p.join()
    remove_tree(inv.workspace)
    if report.failure is not None:
        return None
    median = statistics.median(counts)
    guess = sum(int(c < median) << i for i, c in enumerate(counts))
    return sum(((secret ^ guess) >> i & 1) == 0 for i in range(BITS))


def _capacity(correct: int, total: int) -> float:
    p = min(correct, total - correct) / total  # an inverted decoder is as good
    h = 0.0 if p == 0 else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))
    return BITS * (1 - h)


async def run(runtime: str, trials: int, base: Path) -> None:
    host = os.cpu_count() or 1
    seed = make_seed(base / f"seed-{runtime}")
    oci = policy.OCI_RUNTIMES[runtime]
    print(f"\n## {runtime} ({oci}), {trials} trials x {BITS} bits, slot {SLOT_S}s")
    print("| placement | encoder | correct/total | chance: n/2 +- (4.5 sd) | bits per trial |")
    print("| --- | --- | --- | --- | --- |")
    saved = spec._host_config
    try:
        for placement in ("shared", "cpuset"):
            for kind in ("cpu", "mem"):
                if placement == "shared":

                    def no_cpuset(*a, **k):
                        config = saved(*a, **k)
                        config.pop("CpusetCpus", None)
                        return config

                    spec._host_config = no_cpuset
                    cpus = list(range(host))
                else:
                    spec._host_config = saved
                    cpus = _expand(agent_cpus(host))
                runner = DockerRunner(settings(runtime))
                work = base / f"work-{runtime}-{placement}-{kind}"
                work.mkdir(mode=0o700)
                correct = total = 0
                try:
                    await runner.warm([seed])
                    for _ in range(trials):
                        got = await _trial(runner, work, seed, kind, cpus)
                        if got is not None:
                            correct += got
                            total += BITS
                finally:
                    with trio.CancelScope(shield=True):
                        await runner.reconcile()
                    runner.close()
                    work.rmdir()
                bound = 4.5 * math.sqrt(total) / 2
                cap = _capacity(correct, total) if total else 0.0
                chance = f"{total / 2:.0f} +- {bound:.0f}"
                print(f"| {placement} | {kind} | {correct}/{total} | {chance} | {cap:.2f} |")
                sys.stdout.flush()
    finally:
        spec._host_config = saved
        remove_seed(seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--runtime", choices=("docker", "gvisor", "both"), default="both")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bq-contention-"))
    base.chmod(0o755)
    for runtime in ("docker", "gvisor") if args.runtime == "both" else (args.runtime,):
        trio.run(run, runtime, args.trials, base)
    base.rmdir()


if __name__ == "__main__":
    main()
