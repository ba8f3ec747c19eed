"""What a bounded-agent enclave costs (spec 15.5): prints a table, asserts nothing.

For each runtime, N times: one enclave from ``bounded-query-enclave-claude:latest``
with the real Claude Code and the adapter, against the scripted fake provider
(two model requests: a Bash tool call that reads a marker, then the answer),
exactly as ``tests/enclave/test_enclave_engine.py`` runs it. Columns (medians):
create+start (Engine API create and start), engine (start until the container
exited: the adapter, the engine's two turns and its tool call), total (create
to removed), peak memory (cgroup v1 ``memory.max_usage_in_bytes``, sampled
every 50 ms while the container runs; ``-`` when the runtime keeps no such
cgroup file). Runtimes: ``docker`` (runc) on the internal network;
``gvisor`` on ``runsc-net`` when dockerd has it, and always
``runsc (loopback)``: the queries' network-less runsc registration with the
fake provider inside the enclave on loopback (``helpers.run_loopback``).
Needs root, the engine and the images:

    python3 tests/bench/bench_enclave.py [N]
"""

from __future__ import annotations

import secrets
import statistics
import sys
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.enclave.helpers import EnclaveRun, Rig, run_loopback, runtime_registered, start_rig


def _script(marker: str) -> dict[str, str]:
    return {"command": "cat marker.txt", "marker": marker, "answer": "true", "wrong_answer": "0"}


def _networked(rig: Rig, runtime: str) -> EnclaveRun:
    marker = secrets.token_hex(8)
    seed = rig.seed({"marker.txt": marker + "\n"})
    rig.set_script(_script(marker))
    run = rig.run(
        rig.settings(runtime), seed, "Does marker.txt hold a marker?", {"type": "boolean"}
    )
    if run.result != b"true":
        raise SystemExit(f"{runtime}: no answer (exit {run.exit_code}): {run.logs[-500:]}")
    return run


def _loopback(client: docker.DockerClient) -> EnclaveRun:
    marker = secrets.token_hex(8)
    run, _ = run_loopback(client, "runsc", {"marker.txt": marker + "\n"}, _script(marker))
    if run.result != b"true":
        raise SystemExit(f"runsc (loopback): no answer (exit {run.exit_code}): {run.logs[-500:]}")
    return run


def _row(label: str, runs: list[EnclaveRun]) -> str:
    def med(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} s"

    peaks = [r.peak_memory for r in runs if r.peak_memory is not None]
    peak = f"{statistics.median(peaks) / 2**20:.0f} MiB" if peaks else "-"
    return (
        f"| {label} | {len(runs)} | {med([r.create_start_s for r in runs])} "
        f"| {med([r.engine_s for r in runs])} | {med([r.total_s for r in runs])} | {peak} |"
    )


def main(argv: list[str]) -> int:
    trials = int(argv[0]) if argv else 5
    client = docker.DockerClient(base_url="unix:///var/run/docker.sock", timeout=120)
    rows = []
    rig = start_rig(client)
    try:
        for runtime in ("docker", "gvisor"):
            if not runtime_registered(client, runtime):
                rows.append(f"| {runtime} | 0 | not registered (runsc-net) | | | |")
                continue
            rows.append(_row(runtime, [_networked(rig, runtime) for _ in range(trials)]))
    finally:
        rig.close()
    rows.append(_row("runsc (loopback)", [_loopback(client) for _ in range(trials)]))
    print("| runtime | trials | create+start | engine | total | peak memory |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
