"""Benchmark: staging cost by repository size (prints a table; never asserts).

    python -m tests.harness.bench_harness_staging [FILES ...]

For each size, builds a repository of FILES small files in one commit,
stages it with --seed-source (clone --no-local, scrub, strip write bits,
static verification and the uid-65534 ``find`` probe) and reports the
median of three runs per phase.
"""

from __future__ import annotations

import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bounded_query.harness.configuration.config import PrivateRepo
from bounded_query.harness.lifecycle.paths import run_paths
from bounded_query.harness.staging import seeds as staging
from bounded_query.harness.staging.seeds import SeedSpec, create_private_root, remove_read_only_tree
from tests.harness.bq_harness_helpers import git, var_tmp_base


def make_big_repo(path: Path, files: int) -> None:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    for index in range(files):
        directory = path / f"d{index // 100:04d}"
        directory.mkdir(exist_ok=True)
        (directory / f"f{index}.txt").write_text(f"file {index}\n" * 8)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "big")


def timed_phases(source: Path, base: Path) -> dict[str, float]:
    phases: dict[str, float] = {}
    originals = {
        name: getattr(staging, name)
        for name in ("_clone", "scrub", "make_read_only", "verify_seed")
    }

    def wrap(name: str) -> object:
        def inner(*args: object, **kwargs: object) -> object:
            started = time.perf_counter()
            try:
                return originals[name](*args, **kwargs)
            finally:
                phases[name.strip("_")] = time.perf_counter() - started

        return inner

    for name in originals:
        setattr(staging, name, wrap(name))
    try:
        paths = run_paths(os.getuid(), base, secrets.token_hex(16), base=base)
        create_private_root(paths)
        started = time.perf_counter()
        staging.stage_seeds(
            [SeedSpec(PrivateRepo("bench/repo", "internal"), source)],
            paths,
            {},
            None,
            progress=False,
        )
        phases["total"] = time.perf_counter() - started
        started = time.perf_counter()
        remove_read_only_tree(paths.private_root)
        phases["remove"] = time.perf_counter() - started
    finally:
        for name, function in originals.items():
            setattr(staging, name, function)
    return phases


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [100, 2000, 20000]
    columns = ("clone", "scrub", "make_read_only", "verify_seed", "total", "remove")
    print(f"{'files':>7} " + " ".join(f"{c:>15}" for c in columns) + "   (median of 3, seconds)")
    with var_tmp_base() as base:
        for size in sizes:
            with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
                source = Path(tmp) / "repo"
                make_big_repo(source, size)
                runs = [timed_phases(source, base) for _ in range(3)]
            medians = [statistics.median(r[c] for r in runs) for c in columns]
            print(f"{size:>7} " + " ".join(f"{m:>15.3f}" for m in medians))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
