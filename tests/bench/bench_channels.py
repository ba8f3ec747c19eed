"""Cross-invocation channels, measured (issue 9): bits a decoder query recovers.

    flock /tmp/bq-engine.lock python3 tests/bench/bench_channels.py [--trials 64]
        [--runtime docker|gvisor|both] [--mode after|before|both] [--no-evict]

For each trial an encoder query gets a random 4-bit secret and modulates all
the shared state of ``tests/sandbox/channels.py``; then a decoder query
records what it observes. Both run through the real DockerRunner in one
run, on a workspace root that is a tmpfs like the harness's quota. Before
each trial the trusted side evicts the page-cache probe files from the host
page cache (as memory pressure would; ``--no-evict`` skips that).

``--mode before`` reproduces the state before issue 9 inside the same
code: no per-invocation tmpfs, no masked paths or cpuset, no page-cache pin,
and the old seccomp profile (fadvise64 and sysinfo allowed). Prints one table per
runtime and mode: correct bits / total, chance bound, capacity in bits per
trial. Tables only, never assertions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bounded_query.broker.mounts import mount_tmpfs, unmount
from bounded_query.broker.protocol import policy
from bounded_query.broker.workspace import remove_tree
from bounded_query.sandbox import DockerRunner, RunnerOptions, docker_runner, spec
from bounded_query.sandbox.storage import tmpfs_quota
from tests.sandbox import channels
from tests.sandbox.helpers import (
    evict_probe_files,
    image_root,
    make_seed,
    new_invocation,
    remove_seed,
    settings,
)


@contextlib.contextmanager
def before_issue_9(runner: DockerRunner) -> Iterator[None]:
    """Patch the runner back to the pre-issue-9 behaviour (see module docstring)."""
    old = json.loads(runner._seccomp)
    allowed = set(old["syscalls"][0]["names"]) | {"fadvise64", "sysinfo"}
    old["syscalls"][0]["names"] = sorted(allowed)
    runner._seccomp = json.dumps(old)
    runner.options = RunnerOptions(pin_page_cache=False)
    saved_storage = docker_runner.private_storage
    saved_host_config = spec._host_config

    def old_host_config(*args, **kwargs):
        config = saved_host_config(*args, **kwargs)
        for key in ("MaskedPaths", "ReadonlyPaths", "CpusetCpus"):
            config.pop(key, None)
        return config

    docker_runner.private_storage = lambda *_a: False
    spec._host_config = old_host_config
    try:
        yield
    finally:
        docker_runner.private_storage = saved_storage
        spec._host_config = saved_host_config


async def trials(runtime: str, mode: str, count: int, evict_cache: bool, base: Path) -> None:
    cfg = settings(runtime)
    runner = DockerRunner(cfg)
    root = image_root()
    seed = make_seed(base / f"seed-{runtime}-{mode}")
    work = base / f"work-{runtime}-{mode}"
    work.mkdir(mode=0o700)
    mount_tmpfs(work, tmpfs_quota(cfg.memory_bytes).options)
    secret_list: list[int] = []
    observations: list[dict[str, float]] = []
    patch = before_issue_9(runner) if mode == "before" else contextlib.nullcontext()
    try:
        with patch:
            await runner.warm([seed])
            for _ in range(count):
                if evict_cache:
                    evict_probe_files(root)
                secret = secrets.randbelow(2**channels.BITS)
                enc = new_invocation(cfg, work, seed, channels.encoder(secret))
                report = await runner.run(enc)
                assert report.failure is None, report
                assert remove_tree(enc.workspace)
                dec = new_invocation(cfg, work, seed, channels.decoder())
                report = await runner.run(dec)
                assert report.failure is None, report
                observations.append(json.loads(report.result or b"{}"))
                assert remove_tree(dec.workspace)
                secret_list.append(secret)
    finally:
        with trio.CancelScope(shield=True):
            await runner.reconcile()
        runner.close()
        unmount(work)
        work.rmdir()
        remove_seed(seed)
    if os.environ.get("BQ_CHANNELS_RAW"):
        for secret, obs in zip(secret_list, observations, strict=True):
            print(secret, {k: obs[k] for k in ("ino_pipe", "ino_socket", "cache_ns_0")})
    results = channels.evaluate(secret_list, observations)
    print(f"\n## {runtime} ({policy.OCI_RUNTIMES[runtime]}), {mode}, {count} trials")
    print("| channel | correct/total bits | chance: n/2 +- | capacity bits/trial | feature |")
    print("| --- | --- | --- | --- | --- |")
    for name, (correct, total, feature) in results.items():
        bound = channels.CHANCE_SIGMAS * total**0.5 / 2
        cap = channels.capacity_bits(correct, total)
        verdict = "chance" if channels.at_chance(correct, total) else "OPEN"
        print(f"| {name} | {correct}/{total} ({verdict}) | {bound:.0f} | {cap:.2f} | {feature} |")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--runtime", choices=("docker", "gvisor", "both"), default="both")
    parser.add_argument("--mode", choices=("after", "before", "both"), default="both")
    parser.add_argument("--no-evict", action="store_true")
    args = parser.parse_args()
    runtimes = ("docker", "gvisor") if args.runtime == "both" else (args.runtime,)
    modes = ("before", "after") if args.mode == "both" else (args.mode,)
    base = Path(tempfile.mkdtemp(prefix="bq-channels-"))
    base.chmod(0o755)
    for runtime in runtimes:
        for mode in modes:
            trio.run(trials, runtime, mode, args.trials, not args.no_evict, base)
    base.rmdir()


if __name__ == "__main__":
    main()
