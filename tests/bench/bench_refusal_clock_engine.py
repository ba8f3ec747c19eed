"""The refusal clock through a real broker and a real runc query (issue 9 part 5).

Starts the real broker entry point (``python -m bounded_query.broker``, the
real sandbox runner) in its own process, then times malformed-request
refusals from this process, one after another with a 2 ms gap: first with
the broker idle, then while a query creates 30,000 files in its ``/query``
tmpfs. A refusal answered at once shows the query's load (and the moment
it ends); a gated one leaves with the query's bucketed answer.

    flock /tmp/bq-engine.lock python tests/bench/bench_refusal_clock_engine.py [docker|gvisor]

``BQ_BROKER_PYTHONPATH`` (optional) is put first on the broker's
``PYTHONPATH``, to measure another checkout of the package (the "before").
Tables only, never assertions.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from tests.broker.helpers import request_bytes  # noqa: E402

GARBAGE = b"NOT HTTP AT ALL\r\n\r\n"
FILES_SCRIPT = (
    "import os\n"
    "os.makedirs('/query/t', exist_ok=True)\n"
    "for i in range(30000):\n"
    "    open(f'/query/t/{i}', 'w').close()\n"
    "open('/query/out', 'w').write('true')\n"
)
REPO = "octo/bench"


def write_config(base: Path, runtime: str) -> Path:
    private = base / "private"
    seed_id = secrets.token_hex(8)
    (private / "seeds" / seed_id).mkdir(parents=True)
    (private / "seeds" / seed_id / "README").write_text("bench\n")
    seed_map = private / "seed-map.json"
    entry = {"repo": REPO, "seedId": seed_id, "sensitivity": "public", "commit": "a" * 40}
    seed_map.write_text(json.dumps({"version": 1, "repos": [entry]}))
    doc = {
        "version": 1,
        "runId": secrets.token_hex(16),
        "socketPath": str(base / "run" / "broker.sock"),
        "socketUid": None,
        "socketGid": None,
        "privateRoot": str(private),
        "seedMap": str(seed_map),
        "runtime": runtime,
        "timeout": 60,
        "memoryLimit": "512m",
        "maxInvocations": 10_000,
        "image": "bounded-query-python:latest",
        "dockerHost": "unix:///var/run/docker.sock",
        "hostPathMap": {},
    }
    path = base / "broker.json"
    path.write_text(json.dumps(doc))
    return path


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


async def sample(sock: str, found: list[float]) -> None:
    start = time.monotonic()
    await one(sock, GARBAGE)
    found.append((time.monotonic() - start) * 1000)
    await trio.sleep(0.002)


def row(name: str, values: list[float]) -> None:
    values = sorted(values)
    if not values:
        print(f"{name:34} {0:6d}")
        return
    q = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else values * 9
    print(
        f"{name:34} {len(values):6d} {values[0]:8.2f} {statistics.median(values):8.2f} "
        f"{q[8]:8.2f} {values[-1]:8.2f}"
    )


def start_broker(base: Path, config: Path) -> subprocess.Popen[bytes]:
    """Start the real broker entry point and wait for its readiness file."""
    env = dict(os.environ)
    extra = os.environ.get("BQ_BROKER_PYTHONPATH")
    if extra:
        env["PYTHONPATH"] = extra + os.pathsep + env.get("PYTHONPATH", "")
    log = (base / "stderr.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bounded_query.broker", "--config", str(config)],
        env=env,
        cwd=base,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    log.close()
    ready = base / "private" / "control" / "ready"
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit((base / "stderr.log").read_text())
        time.sleep(0.05)
    return proc


async def measure(sock: str) -> tuple[bool, list[float], list[float], list[str]]:
    warm = await one(sock, request_bytes(FILES_SCRIPT, repo=REPO))
    idle: list[float] = []
    for _ in range(300):
        await sample(sock, idle)
    during: list[float] = []
    answers: list[str] = []
    for _ in range(3):
        done = trio.Event()
        async with trio.open_nursery() as nursery:

            async def query(done: trio.Event = done) -> None:
                start = time.monotonic()
                got = await one(sock, request_bytes(FILES_SCRIPT, repo=REPO))
                ok = got.endswith(b'{"status":"ok","result":true}')
                answers.append(f"{time.monotonic() - start:.3f}{'' if ok else ' (error)'}")
                done.set()

            nursery.start_soon(query)
            await trio.sleep(0.05)
            while not done.is_set():
                await sample(sock, during)
    return warm.endswith(b"true}"), idle, during, answers


def main(runtime: str) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-clock-engine-") as tmp:
        base = Path(tmp)
        config = write_config(base, runtime)
        sock = json.loads(config.read_text())["socketPath"]
        proc = start_broker(base, config)
        try:
            warm, idle, during, answers = trio.run(measure, sock)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    label = os.environ.get("BQ_BROKER_PYTHONPATH") or "this checkout"
    print(f"refusal latency, ms ({runtime}, {label}); warm-up answer ok: {warm}")
    print(f"{'state':34} {'n':>6} {'min':>8} {'median':>8} {'p90':>8} {'max':>8}")
    row("idle broker", idle)
    row("during a 30,000-file query (x3)", during)
    print(f"query answers (s): {', '.join(answers)}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docker")
