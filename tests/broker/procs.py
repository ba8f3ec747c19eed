"""Run the broker as a real subprocess (tests-only entry point with the fake runner)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def start_broker(
    config_path: Path,
    *,
    wait: bool = True,
    module: str = "tests.fakes.broker_main",
    env_extra: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``module`` (a test entry point) and wait for the readiness file."""
    config = json.loads(config_path.read_text())
    ready = Path(config["privateRoot"]) / "control" / "ready"
    env = dict(os.environ)
    env.update(env_extra or {})
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # A SIGKILLed broker leaves its readiness file behind; only a fresh one counts.
    ready.unlink(missing_ok=True)
    log = stderr_log(config_path)
    with log.open("ab") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--config", str(config_path)],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    if wait:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.poll() is not None:
                raise AssertionError(f"broker exited {proc.returncode}: {log.read_text()}")
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError("broker did not become ready")
            time.sleep(0.01)
    return proc


def stderr_log(config_path: Path) -> Path:
    """Where the broker subprocess's stderr (JSON event lines) goes."""
    return config_path.with_name("broker-stderr.log")


def query_processes(marker: str) -> list[int]:
    """PIDs of fake-runner query processes whose workspace path contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b".query-script.py" in cmdline and marker.encode() in cmdline:
            found.append(int(entry))
    return found
