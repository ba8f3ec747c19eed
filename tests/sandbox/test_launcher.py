"""The prepared container's launcher (sandbox/launcher.py), run as the container runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bounded_query.sandbox import launcher
from bounded_query.sandbox.prepared_pool import launcher_source

LIMIT = 100


def run_launcher(stdin: bytes, tmp_path, *, limit: int = LIMIT) -> subprocess.CompletedProcess:
    """``python3 -I -S -c SOURCE LIMIT`` with its fixed paths moved under ``tmp_path``.

    Each call gets fresh directories, as each container does.
    """
    awf, query = tmp_path / "awf", tmp_path / "query"
    for path in (awf, query):
        if path.exists():
            for child in path.iterdir():
                child.unlink()
        else:
            path.mkdir()
    source = (
        launcher_source()
        .replace('SCRIPT_DIR = "/awf"', f"SCRIPT_DIR = {str(awf)!r}")
        .replace('QUERY = "/query"', f"QUERY = {str(query)!r}")
    )
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", source, str(limit)],
        input=stdin,
        capture_output=True,
        check=False,
        timeout=60,
    )


def test_source_is_the_module_file():
    assert launcher_source() == Path(launcher.__file__).read_text(encoding="utf-8")


def test_runs_the_delivered_script_as_main_in_query(tmp_path):
    script = b"import os, sys\nprint(__name__, os.getcwd(), sys.argv[0], sys.stdin.read() == '')\n"
    done = run_launcher(script, tmp_path)
    assert done.returncode == 0, done.stderr
    awf, query = tmp_path / "awf", tmp_path / "query"
    assert done.stdout.decode().split() == [
        "__main__",
        str(query),
        f"{awf}/query-script.py",
        "True",
    ]
    written = awf / "query-script.py"
    assert written.read_bytes() == script
    assert written.stat().st_mode & 0o777 == 0o444


def test_exit_status_and_signals_are_passed_on(tmp_path):
    assert run_launcher(b"raise SystemExit(7)", tmp_path).returncode == 7
    killed = run_launcher(b"import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", tmp_path)
    assert killed.returncode == 128 + 9


def test_nothing_runs_without_a_complete_script(tmp_path):
    """Empty or oversize input: the delivery failed, no script is written or run."""
    for stdin in (b"", b"#" * (LIMIT + 1)):
        done = run_launcher(stdin, tmp_path)
        assert done.returncode == launcher.DELIVERY_FAILED
        assert not (tmp_path / "awf" / "query-script.py").exists()
    assert run_launcher(b"#" * LIMIT, tmp_path).returncode == 0


def test_read_script_caps_input():
    r, w = os.pipe()
    os.write(w, b"abc")
    os.close(w)
    saved = os.dup(0)
    try:
        os.dup2(r, 0)
        assert launcher.read_script(2) is None
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(r)
