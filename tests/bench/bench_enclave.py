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

A second table goes through the enclave runner (``sandbox/enclave_runner.py``)
as the agent broker does, on runc, with the real API proxy container at its
fixed address in front of the fake (``tests/enclave/runner_rig.py``): the
medians of each phase of ``RunReport.phases`` (prepare the workspace, arm
the proxy, the topology checks, create, start, engine, remove and confirm,
disarm, read the result) and of the whole ``run``. The proxy image is
``bounded-query-api-proxy:latest`` or ``$BQ_APIPROXY_TEST_IMAGE``.
Needs root, the engine and the images:

    python3 tests/bench/bench_enclave.py [N] [--runner-only]
"""

from __future__ import annotations

import secrets
import statistics
import sys
import time
from pathlib import Path

import docker
import docker.errors
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.enclave.helpers import EnclaveRun, Rig, run_loopback, runtime_registered, start_rig
from tests.enclave.runner_rig import PROXY_IMAGE, ProxyRig, start_proxy_rig

RUNNER_PHASES = (
    "prepare",
    "arm",
    "topology",
    "create",
    "start",
    "engine",
    "remove",
    "disarm",
    "result",
)


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


async def _through_runner(rig: ProxyRig, trials: int) -> list[dict[str, float]]:
    """``trials`` invocations of one runner (preflight once); each run's phases and total."""
    runner = rig.runner()
    runs = []
    try:
        await runner.preflight()
        for _ in range(trials):
            marker = secrets.token_hex(8)
            rig.set_script(_script(marker))
            seed = rig.seed({"marker.txt": marker + "\n"})
            invocation = rig.invocation(
                runner, seed, "Does marker.txt hold a marker?", {"type": "boolean"}
            )
            started = time.perf_counter()
            report = await runner.run(invocation)
            total = time.perf_counter() - started
            if report.failure is not None or report.result != b"true":
                raise SystemExit(f"runner: {report.failure} {report.result!r}")
            runs.append({**report.phases, "total": total})
    finally:
        await runner.reconcile()
        await runner.aclose()
    return runs


def _runner_table(runs: list[dict[str, float]]) -> str:
    def med(name: str) -> str:
        return f"{statistics.median(r.get(name, 0.0) for r in runs) * 1000:.0f} ms"

    names = [*RUNNER_PHASES, "total"]
    return "\n".join(
        [
            f"| runtime | trials | {' | '.join(names)} |",
            "| --- | --- | " + " | ".join("---" for _ in names) + " |",
            f"| docker (runner) | {len(runs)} | {' | '.join(med(n) for n in names)} |",
        ]
    )


def _engine_tables(client: docker.DockerClient, trials: int) -> None:
    rows = []
    rig = start_rig(client)
    try:
        for runtime in ("docker", "gvisor"):
            if not runtime_registered(client, runtime):
                rows.append(f"| {runtime} | 0 | not registered (runsc-net) | | | |")
                continue
            try:
                rows.append(_row(runtime, [_networked(rig, runtime) for _ in range(trials)]))
            except docker.errors.APIError as exc:  # runsc-net cannot network here: fails closed
                rows.append(f"| {runtime} | 0 | fails closed: {str(exc)[-80:]} | | | |")
    finally:
        rig.close()
    rows.append(_row("runsc (loopback)", [_loopback(client) for _ in range(trials)]))
    print("| runtime | trials | create+start | engine | total | peak memory |")
    print("| --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print()


def main(argv: list[str]) -> int:
    from bounded_query.harness.configuration.apiproxy_image import ensure_apiproxy_image

    numbers = [a for a in argv if not a.startswith("--")]
    trials = int(numbers[0]) if numbers else 5
    client = docker.DockerClient(base_url="unix:///var/run/docker.sock", timeout=120)
    if "--runner-only" not in argv:
        _engine_tables(client, trials)
    ensure_apiproxy_image("unix:///var/run/docker.sock", tag=PROXY_IMAGE)
    proxy_rig = start_proxy_rig(client)
    try:
        runs = trio.run(_through_runner, proxy_rig, trials)
    finally:
        proxy_rig.close()
    print(_runner_table(runs))
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
