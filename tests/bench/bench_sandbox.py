"""Query-latency benchmark of the sandbox runners (issue 4 "Performance").

    python tests/bench/bench_sandbox.py [--seeds DIR] [--queries 20]
        [--runtimes docker,gvisor] [--sizes tiny,medium,large] [--baseline] [--no-cli]

For each runtime and synthetic repository (``/work/shared/bench/gen_seeds.py``:
tiny 11 files, medium 2,001 files / 21 MB, large 20,001 files / 210 MB) it
runs ``--queries`` trivial boolean queries (the script writes ``true``) the
way the broker does: fresh workspace, ``runner.run``, the broker's result
reader and strict output check, workspace removal. Processing time is that
whole span (the broker then waits for the bucket boundary, not measured
here). Printed per runtime and size: min / median / max, the timing-bucket
histogram (10 ms / 100 ms / 1 s / 10 s / 60 s / 600 s), the share in the
1 s bucket, the one-off first query of a seed (it prepares the seed's view
layer), and the median of each phase (create, start, wait, remove, ...;
``materialize`` and ``run`` come from the entrypoint's timing line in a
separate pass). ``--baseline`` also measures the in-container copy into the
tmpfs (``RunnerOptions(materialize="tmpfs")``) for comparison; the SDK-vs-CLI
comparison runs ``docker run`` with equivalent flags once (tiny, runc).

Modes (issue 20): ``prepared`` (the broker's default: the idle hook
prepares the next container between questions, outside the timed span; its
table column "prepared memory" is the prepared containers' cgroup memory),
``overlay`` (cold: every query starts its own container) and, with
``--baseline``, ``tmpfs``; the share in the 100 ms bucket is printed too.

A benchmark prints tables; it asserts nothing about timing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from bounded_query.broker.protocol import check_output, parse_schema
from bounded_query.broker.runner import Invocation, RunnerSettings
from bounded_query.broker.workspace import remove_tree
from bounded_query.sandbox import DockerRunner, RunnerOptions
from bounded_query.seccomp import profile_json

GEN_SEEDS = Path("/work/shared/bench/gen_seeds.py")
IMAGE = "bounded-query-python:latest"
SCRIPT = b"open('/query/out', 'w').write('true')\n"
BOOLEAN = parse_schema({"type": "boolean"})
BUCKETS = [(0.010, "10ms"), (0.100, "100ms"), (1.0, "1s"), (10.0, "10s"), (60.0, "60s"),
           (600.0, "600s")]  # fmt: skip
MEMORY = 512 * 1024**2


def bucket_of(seconds: float) -> str:
    for limit, name in BUCKETS:
        if seconds <= limit:
            return name
    return "overflow"


def ensure_seeds(out: Path, sizes: list[str]) -> dict[str, Path]:
    if not all((out / s / ".git").is_dir() for s in sizes):
        out.mkdir(parents=True, exist_ok=True)
        missing = [s for s in sizes if not (out / s / ".git").is_dir()]
        subprocess.run(
            [sys.executable, str(GEN_SEEDS), "--out", str(out), "--sizes", ",".join(missing)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return {s: out / s for s in sizes}


def settings(runtime: str) -> RunnerSettings:
    return RunnerSettings(runtime, secrets.token_hex(16), IMAGE, 60, MEMORY)


async def one_query(runner: DockerRunner, seed: Path, work: Path) -> tuple[float, dict[str, float]]:
    """One broker-like invocation; returns (processing seconds, phases).

    A failed query (e.g. the tmpfs copy of the large seed out of memory
    under runsc) is reported with the phase ``failed`` = 1.
    """
    started = time.perf_counter()
    invocation_id = secrets.token_hex(16)
    workspace = work / invocation_id
    await trio.to_thread.run_sync(lambda: workspace.mkdir(mode=0o700))
    invocation = Invocation(runner.settings.run_id, invocation_id, seed, workspace, SCRIPT)
    report = await runner.run(invocation)
    raw = report.result
    ok = report.failure is None and raw is not None and check_output(raw, BOOLEAN) == "true"
    cleanup_started = time.perf_counter()
    await trio.to_thread.run_sync(remove_tree, workspace)
    finished = time.perf_counter()
    phases = dict(report.phases)
    if not ok:
        print(f"# query failed: {report.failure}", file=sys.stderr)
        phases["failed"] = 1.0
    phases["host-cleanup"] = finished - cleanup_started
    return finished - started, phases


def prepared_memory(runner: DockerRunner) -> int:
    """Bytes the runner's prepared containers hold: their cgroups' usage (blocking).

    Reads ``memory.usage_in_bytes`` of each running container of the run
    (cgroup v1, Docker's cgroupfs layout); the shim and, under gVisor, the
    sandbox's sentry and gofer outside the container's cgroup are not in it
    (the README notes them).
    """
    total = 0
    label = f"bounded-query.run={runner.settings.run_id}"
    for found in runner.api.containers(filters={"label": label, "status": "running"}):
        if found.get("Labels", {}).get("bounded-query.role") == "page-cache-pin":
            continue
        path = Path("/sys/fs/cgroup/memory/docker") / found["Id"] / "memory.usage_in_bytes"
        with contextlib.suppress(OSError, ValueError):
            total += int(path.read_text())
    return total


def fmt_hist(times: list[float]) -> str:
    counts = {name: 0 for _, name in BUCKETS}
    for t in times:
        counts[bucket_of(t)] = counts.get(bucket_of(t), 0) + 1
    return " ".join(f"{name}:{counts[name]}" for _, name in BUCKETS if counts[name])


#: Cells: repository view and whether the idle hook prepares the next container.
MODES = {
    "prepared": RunnerOptions(materialize="overlay", prepared=True),
    "overlay": RunnerOptions(materialize="overlay", prepared=False),
    "tmpfs": RunnerOptions(materialize="tmpfs"),
}


async def bench_cell(runtime: str, seed: Path, work: Path, n: int, mode: str) -> dict[str, object]:
    """``n`` timed queries; with ``prepared`` the broker's idle hook runs after each.

    The hook (``runner.prepare``) is outside the timed span, as it is after
    the answer in the broker; the agent's think time between questions is
    far longer than a preparation.
    """
    options = MODES[mode]
    runner = DockerRunner(settings(runtime), options=options)
    try:
        first, _ = await one_query(runner, seed, work)
        times, phases = [], []
        memory: list[int] = []
        for _ in range(n):
            if options.prepared:
                await runner.prepare(seed, work)
                memory.append(await trio.to_thread.run_sync(prepared_memory, runner))
            t, p = await one_query(runner, seed, work)
            times.append(t)
            phases.append(p)
        inner = []
        if not options.prepared:  # the entrypoint's own timing line (cold path only)
            timed = DockerRunner(
                runner.settings,
                options=RunnerOptions(("--timings",), collect_timings=True, materialize=mode),
            )
            try:
                for _ in range(3):
                    inner.append((await one_query(timed, seed, work))[1])
            finally:
                timed.close()
    finally:
        with trio.CancelScope(shield=True):
            await runner.reconcile()  # containers and volumes of this cell
        runner.close()
    names = sorted({k for p in phases for k in p})
    return {
        "memory": statistics.median(memory) if memory else 0,
        "failed": sum(int(p.get("failed", 0)) for p in phases),
        "first": first,
        "times": times,
        "phases": {k: statistics.median(p.get(k, 0.0) for p in phases) for k in names},
        "inner": {
            k: statistics.median(p.get(k, 0.0) for p in inner)
            for k in ("materialize", "run")
            if inner
        },
    }


def cli_vs_sdk(seed: Path, work: Path, n: int) -> tuple[float, float]:
    """Median seconds of ``docker run`` with equivalent flags vs the SDK runner (tiny, runc)."""
    profile = Path(work) / "seccomp.json"
    profile.write_text(profile_json("runc"))
    cli = []
    for _ in range(n):
        ws = work / secrets.token_hex(8)
        ws.mkdir(mode=0o700)
        (ws / "script.py").write_bytes(SCRIPT)
        (ws / "out").touch()
        os.chown(ws / "out", 65534, 65534)
        started = time.perf_counter()
        subprocess.run(
            ["docker", "run", "--rm", "--network", "none", "--read-only", "--user", "65534:65534",
             "--cap-drop", "ALL", "--security-opt", "no-new-privileges:true",
             "--security-opt", f"seccomp={profile}", "--memory", str(MEMORY), "--memory-swap",
             str(MEMORY), "--cpus", "1", "--pids-limit", "128", "--ulimit", "nofile=1024:1024",
             "--ulimit", f"fsize={MEMORY}", "--log-driver", "none",
             "--tmpfs", f"/query:size={MEMORY},uid=65534,gid=65534,mode=0755",
             "--tmpfs", "/tmp:size=67108864,mode=1777",
             "--mount", f"type=bind,src={seed},dst=/awf/seed,readonly",
             "--mount", f"type=bind,src={ws / 'script.py'},dst=/awf/query-script.py,readonly",
             "--mount", f"type=bind,src={ws / 'out'},dst=/query/out",
             IMAGE],
            check=True,
        )  # fmt: skip
        cli.append(time.perf_counter() - started)
        shutil.rmtree(ws)

    async def sdk() -> list[float]:
        runner = DockerRunner(settings("docker"), options=RunnerOptions(materialize="tmpfs"))
        try:
            return [(await one_query(runner, seed, work))[0] for _ in range(n)]
        finally:
            await runner.reconcile()
            runner.close()

    return statistics.median(cli), statistics.median(trio.run(sdk))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_seeds = Path(tempfile.gettempdir()) / "bq-bench-seeds"
    parser.add_argument("--seeds", type=Path, default=default_seeds)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--runtimes", default="docker,gvisor")
    parser.add_argument("--sizes", default="tiny,medium,large")
    parser.add_argument("--baseline", action="store_true", help="also measure the tmpfs copy")
    parser.add_argument("--no-cli", action="store_true", help="skip the SDK-vs-CLI comparison")
    args = parser.parse_args(argv)
    sizes = args.sizes.split(",")
    seeds = ensure_seeds(args.seeds, sizes)
    modes = ["prepared", "overlay", "tmpfs"] if args.baseline else ["prepared", "overlay"]
    work = Path(tempfile.mkdtemp(prefix="bq-bench-work-"))
    results = []
    try:
        for runtime in args.runtimes.split(","):
            for mode in modes:
                for size in sizes:
                    n = args.queries if mode != "tmpfs" else max(3, args.queries // 4)
                    cell = trio.run(bench_cell, runtime, seeds[size], work, n, mode)
                    results.append((runtime, mode, size, cell))
                    print(f"# done {runtime} {mode} {size}", file=sys.stderr, flush=True)
        cli = None if args.no_cli else cli_vs_sdk(seeds[sizes[0]], work, 10)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\n{args.queries} trivial boolean queries per cell; processing = workspace + "
        "run + result check + workspace removal (seconds)\n"
    )
    print(
        "| runtime | mode | size | min | median | max | in 100 ms bucket | in 1 s bucket "
        "| buckets | first query | failed | prepared memory |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for runtime, mode, size, cell in results:
        times = cell["times"]
        assert isinstance(times, list)
        fast = sum(1 for t in times if t <= 0.1) / len(times)
        share = sum(1 for t in times if t <= 1.0) / len(times)
        memory = cell["memory"]
        assert isinstance(memory, int | float)
        print(
            f"| {runtime} | {mode} | {size} | {min(times):.3f} | {statistics.median(times):.3f} "
            f"| {max(times):.3f} | {fast:.0%} | {share:.0%} | {fmt_hist(times)} "
            f"| {cell['first']:.2f} | {cell['failed']} "
            f"| {memory / 2**20:.1f} MiB |"
        )
    print("\nPhase medians (seconds; materialize/run from the entrypoint, 3 extra queries)\n")
    keys = ["view", "take", "cold", "storage", "prepare", "volume", "create", "start", "deliver",
            "wait", "materialize", "run", "remove", "host-cleanup"]  # fmt: skip
    print("| runtime | mode | size | " + " | ".join(keys) + " |")
    print("|---|---|---|" + "---|" * len(keys))
    for runtime, mode, size, cell in results:
        merged: dict[str, float] = {**cell["phases"], **cell["inner"]}  # type: ignore[dict-item]
        print(
            f"| {runtime} | {mode} | {size} | "
            + " | ".join(f"{merged.get(k, 0.0):.3f}" for k in keys)
            + " |"
        )
    if cli is not None:
        print(
            f"\nSDK vs CLI ({sizes[0]}, runc, tmpfs copy, median of 10): "
            f"docker run {cli[0]:.3f} s, SDK runner {cli[1]:.3f} s "
            f"(CLI/SDK = {cli[0] / cli[1]:.2f})"
        )
    print(json.dumps({"generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
