"""Trivial questions end to end: the agent's wrapper, the real broker, the real runner (issue 20).

    flock /tmp/bq-engine.lock python3 tests/bench/bench_end_to_end.py
        [--runtimes docker,gvisor] [--queries 20] [--think 0.5]

A real ``BrokerServer`` (in-process, on its Unix socket, with the sandbox
runner) serves ``--queries`` trivial boolean questions per runtime and mode,
each sent by the agent's own wrapper (``bounded-query``, a subprocess, as an
agent runs it), with ``--think`` seconds between questions (an agent's
think time; the broker's idle hook prepares the next container meanwhile).
Modes: ``prepared`` (the default broker) and ``cold`` (``RunnerOptions(
prepared=False)``: every query starts its own container, the pre-issue-20
path). Printed per runtime and mode: the timing buckets the answers left at
(the broker's own choice after cleanup), the share in the 100 ms and 1 s
buckets, the wrapper's wall time (process start to answer) and the medians
of the runner's phases; "lane processing" is lane entry to processing end
(before the bucket wait) and "lane minus runner" what the broker itself
adds (admission, the journal's fsync, workspace, result check). Tables only,
never assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from bounded_query.broker.config import parse_config, parse_seed_map  # noqa: E402
from bounded_query.broker.runner import Invocation, RunReport  # noqa: E402
from bounded_query.broker.server import BrokerServer  # noqa: E402
from bounded_query.broker.timing import bucket_label  # noqa: E402
from bounded_query.sandbox import DockerRunner, RunnerOptions  # noqa: E402
from tests.sandbox.helpers import IMAGE, make_seed, remove_seed  # noqa: E402

REPO = "octo/bench"
SCRIPT = b"open('/query/out', 'w').write('true')\n"
SCHEMA = '{"type":"boolean"}'
WRAPPER = Path(sys.executable).parent / "bounded-query"


class RecordingRunner(DockerRunner):
    """The sandbox runner, keeping each report's phases for the table."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reports: list[RunReport] = []

    async def run(self, invocation: Invocation) -> RunReport:
        report = await super().run(invocation)
        self.reports.append(report)
        return report


def config_doc(base: Path, seed: Path, runtime: str) -> dict[str, object]:
    private = base / "private"
    (private / "seeds").mkdir(parents=True)
    seed_id = secrets.token_hex(8)
    shutil.copytree(seed, private / "seeds" / seed_id, symlinks=True)
    seed_map = private / "seed-map.json"
    entry = {"repo": REPO, "seedId": seed_id, "sensitivity": "public", "commit": "a" * 40}
    seed_map.write_text(json.dumps({"version": 1, "repos": [entry]}))
    return {
        "version": 1,
        "runId": secrets.token_hex(16),
        "socketPath": str(base / "run" / "broker.sock"),
        "socketUid": None,
        "socketGid": None,
        "privateRoot": str(private),
        "seedMap": str(seed_map),
        "runtime": runtime,
        "timeout": 30,
        "memoryLimit": "512m",
        "maxInvocations": 10000,
        "image": IMAGE,
        "dockerHost": "unix:///var/run/docker.sock",
        "hostPathMap": {},
    }


async def cell(base: Path, seed: Path, runtime: str, prepared: bool, n: int, think: float):
    config = parse_config(config_doc(base, seed, runtime))
    seed_map = parse_seed_map(json.loads(config.seed_map_path.read_text()))
    runner = RecordingRunner(config.runner_settings(), options=RunnerOptions(prepared=prepared))
    server = BrokerServer(config, seed_map, runner)
    env = {"PATH": "/usr/bin:/bin", "AWF_BOUNDED_QUERY_SOCKET": str(config.socket_path)}
    buckets: list[str] = []
    walls: list[float] = []
    #: lane entry to processing end (before the bucket wait), and the runner's share
    lanes: list[float] = []
    runs: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        for i in range(n + 1):
            await trio.sleep(think)
            started = time.perf_counter()
            done = await trio.run_process(
                [str(WRAPPER), "--repo", REPO, "--schema", SCHEMA],
                stdin=SCRIPT,
                capture_stdout=True,
                env=env,
            )
            wall = time.perf_counter() - started
            assert server.service is not None
            timing = server.service.last_timing
            answer = done.stdout.strip()
            if answer != b'{"status":"ok","result":true}':
                print(f"# unexpected answer {answer!r}", file=sys.stderr)
            if i == 0:
                continue  # the first query after start-up is not typical either way
            landing = timing[2] if timing else None
            buckets.append(
                bucket_label(round(landing.boundary_s * 1000)) if landing else "overflow"
            )
            walls.append(wall)
            if timing:
                lanes.append(timing[1] - timing[0])
                runs.append(sum(runner.reports[-1].phases.values()))
        server.stop()
    phases = [r.phases for r in runner.reports[1:]]
    names = sorted({k for p in phases for k in p})
    return {
        "buckets": buckets,
        "walls": walls,
        "lane": statistics.median(lanes) if lanes else 0.0,
        "outside": statistics.median(p - r for p, r in zip(lanes, runs, strict=True))
        if lanes
        else 0.0,
        "phases": {k: statistics.median(p.get(k, 0.0) for p in phases) for k in names},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtimes", default="docker,gvisor")
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--think", type=float, default=0.5)
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bq-bench-e2e-"))
    os.chmod(base, 0o755)
    seed = make_seed(base / "seed")
    results = []
    try:
        for runtime in args.runtimes.split(","):
            for mode in ("prepared", "cold"):
                cell_base = base / f"{runtime}-{mode}"
                cell_base.mkdir()
                got = trio.run(
                    cell, cell_base, seed, runtime, mode == "prepared", args.queries, args.think
                )
                results.append((runtime, mode, got))
                print(f"# done {runtime} {mode}", file=sys.stderr, flush=True)
    finally:
        remove_seed(seed)
        shutil.rmtree(base, ignore_errors=True)
    print(f"\n{args.queries} trivial boolean questions per cell through the wrapper and broker\n")
    print(
        "| runtime | mode | buckets | in 100 ms | in 1 s | lane processing | lane minus runner "
        "| wrapper wall median | max |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for runtime, mode, got in results:
        buckets, walls = got["buckets"], got["walls"]
        counts = Counter(buckets)
        hist = " ".join(f"{k}:{v}" for k, v in sorted(counts.items()))
        fast = counts.get("100 ms", 0) + counts.get("10 ms", 0)
        slow = fast + counts.get("1 s", 0)
        print(
            f"| {runtime} | {mode} | {hist} | {fast / len(buckets):.0%} "
            f"| {slow / len(buckets):.0%} | {got['lane']:.3f} | {got['outside']:.3f} "
            f"| {statistics.median(walls):.3f} | {max(walls):.3f} |"
        )
    keys = ["take", "cold", "create", "start", "deliver", "wait", "remove"]
    print("\nRunner phase medians (seconds)\n")
    print("| runtime | mode | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for runtime, mode, got in results:
        phases = got["phases"]
        print(
            f"| {runtime} | {mode} | "
            + " | ".join(f"{phases.get(k, 0.0):.3f}" for k in keys)
            + " |"
        )
    print(json.dumps({"generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
