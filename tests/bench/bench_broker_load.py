"""Hostile-load benchmark against a real broker process (issue #3 "Bad input and load").

Starts the broker (tests-only entry point, subprocess fake runner) and runs
rounds of hostile load, printing per round: connections, answers by kind,
wall time, and the broker's resident memory (VmRSS now, VmHWM = peak). After
each round a valid request must still be answered.

    python tests/bench/bench_broker_load.py

A table, never an assertion (the exit code is non-zero only if the broker
stops answering valid requests).
"""

from __future__ import annotations

import json
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path

import trio

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from bounded_query.broker.http import response_bytes  # noqa: E402
from tests.broker.helpers import ERROR, make_root, request_bytes  # noqa: E402
from tests.broker.procs import start_broker  # noqa: E402
from tests.broker.test_hostile import CORPUS  # noqa: E402

OK_SCRIPT = "import os\nopen(os.environ['QUERY_OUT'], 'w').write('true')\n"
ERROR_RESPONSE = response_bytes(ERROR)
OK_RESPONSE = response_bytes(b'{"status":"ok","result":true}')


def memory_kib(pid: int) -> tuple[int, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


async def one(sock: str, payload: bytes, *, hold_s: float = 0.0) -> bytes:
    try:
        stream = await trio.open_unix_socket(sock)
    except OSError:
        return b"connect-failed"
    async with stream:
        try:
            await stream.send_all(payload)
            if hold_s:
                await trio.sleep(hold_s)
            else:
                await stream.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        data = b""
        with trio.move_on_after(60):
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    break
                if not chunk:
                    break
                data += chunk
        return data


async def burst(sock: str, payloads: list[bytes], *, hold_s: float = 0.0) -> dict[str, int]:
    counts = {"error": 0, "ok": 0, "closed": 0, "other": 0}

    async def run(payload: bytes) -> None:
        data = await one(sock, payload, hold_s=hold_s)
        if data == ERROR_RESPONSE:
            counts["error"] += 1
        elif data == OK_RESPONSE:
            counts["ok"] += 1
        elif data == b"":
            counts["closed"] += 1
        else:
            counts["other"] += 1

    async with trio.open_nursery() as nursery:
        for payload in payloads:
            nursery.start_soon(run, payload)
    return counts


async def main() -> int:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    corpus = [raw for _, raw in CORPUS]
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        make_root(Path(tmp), max_invocations=10000)
        config_path = Path(tmp) / "broker.json"
        sock = json.loads(config_path.read_text())["socketPath"]
        proc = start_broker(config_path)
        rounds = [
            ("corpus, sequential", None, corpus, 0.0),
            (
                "1000 simultaneous, corpus mix",
                "burst",
                [corpus[i % len(corpus)] for i in range(1000)],
                0.0,
            ),
            ("1000 simultaneous, valid", "burst", [request_bytes(OK_SCRIPT)] * 1000, 0.0),
            (
                "500 slowloris heads (held 6 s)",
                "burst",
                [b"POST /query HTTP/1.1\r\nHost: x\r\n"] * 500,
                6.0,
            ),
            (
                "200 x 64 KiB bodies",
                "burst",
                [request_bytes(b"#" * 65536, method="PUT")] * 200,
                0.0,
            ),
            ("200 x oversize bodies", "burst", [request_bytes(b"#" * 70000)] * 200, 0.0),
            (
                "300 x 9 KiB heads",
                "burst",
                [b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n"] * 300,
                0.0,
            ),
        ]
        print(
            f"{'round':34} {'conns':>6} {'error':>6} {'ok':>5} {'closed':>7} {'other':>6} "
            f"{'wall s':>7} {'RSS MiB':>8} {'peak MiB':>9} {'valid after':>12}"
        )
        failed = False
        for name, mode, payloads, hold in rounds:
            start = time.monotonic()
            if mode is None:
                counts = {"error": 0, "ok": 0, "closed": 0, "other": 0}
                for payload in payloads:
                    data = await one(sock, payload)
                    key = {ERROR_RESPONSE: "error", OK_RESPONSE: "ok", b"": "closed"}.get(
                        data, "other"
                    )
                    counts[key] += 1
            else:
                counts = await burst(sock, payloads, hold_s=hold)
            wall = time.monotonic() - start
            rss, peak = memory_kib(proc.pid)
            after = await one(sock, request_bytes(OK_SCRIPT))
            valid = after == OK_RESPONSE
            failed |= not valid
            print(
                f"{name:34} {len(payloads):6} {counts['error']:6} {counts['ok']:5} "
                f"{counts['closed']:7} {counts['other']:6} {wall:7.2f} {rss / 1024:8.1f} "
                f"{peak / 1024:9.1f} {'yes' if valid else 'NO':>12}"
            )
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        print(f"\nbroker exit code after SIGTERM: {code}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(trio.run(main))
