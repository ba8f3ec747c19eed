"""Fake runners for broker tests (never shipped, never reachable from configuration).

* :class:`ScriptedRunner` runs in-process: the "script" is a tiny command
  language, so tests control duration, output and failure exactly (and use
  trio's MockClock for durations).
* :class:`ProcessRunner` runs the script with a real Python subprocess in the
  workspace (the script writes its answer to ``$QUERY_OUT``); the child dies
  with its parent (PR_SET_PDEATHSIG), so a SIGKILLed broker leaves no query
  process behind, like a reconciled container.

Script commands for :class:`ScriptedRunner`, one per line:
``sleep <seconds>``, ``write <text>`` (result file content), ``fail <category>``,
``raise`` (runner bug), ``symlink <target>``, ``fifo``, ``big <n>`` (n bytes),
``readonly`` (make the workspace undeletable for a non-root cleanup),
``dir`` (result path is a directory).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from bounded_query.broker.runner import Degradation, Invocation, RunReport
from bounded_query.broker.workspace import read_result_file


def _answer(path: Path, failure: str | None) -> bytes | None:
    """The runner contract's answer: None after a failure, else the checked read.

    Read inline, not in a worker thread: a small file, and the broker tests
    run on trio's autojump MockClock, which a thread would let jump.
    """
    if failure is not None:
        return None
    return read_result_file(path)


@dataclass
class ScriptedRunner:
    """In-process fake: obeys the command language in the module docstring."""

    calls: list[Invocation] = field(default_factory=list)
    reconciled: int = 0
    preflights: int = 0
    closed: int = 0
    #: Seeds the idle hook asked to prepare, in order.
    prepared: list[Path] = field(default_factory=list)
    #: What :meth:`degradations` reports (tests set it).
    degraded: tuple[Degradation, ...] = ()
    #: Set by :meth:`lose`: what :meth:`watch` returns.
    lost: Degradation | None = None
    _lost_event: trio.Event = field(default_factory=trio.Event)

    def degradations(self) -> tuple[Degradation, ...]:
        return self.degraded if self.lost is None else (*self.degraded, self.lost)

    def lose(self, protection: Degradation) -> None:
        """Lose a protection mid-run, as a killed page-cache pin does."""
        self.lost = protection
        self._lost_event.set()

    async def watch(self) -> Degradation:
        await self._lost_event.wait()
        assert self.lost is not None
        return self.lost

    async def aclose(self) -> None:
        self.closed += 1

    async def preflight(self) -> None:
        self.preflights += 1

    async def reconcile(self) -> int:
        self.reconciled += 1
        return 0

    async def warm(self, seed_dirs: Iterable[Path]) -> dict[str, bool]:
        del seed_dirs  # nothing to prepare
        return {}

    async def prepare(self, seed_dir: Path, work_root: Path) -> None:
        del work_root  # nothing is created there
        self.prepared.append(seed_dir)

    async def run(self, invocation: Invocation) -> RunReport:
        self.calls.append(invocation)
        assert invocation.workspace.is_dir()
        assert (invocation.workspace.stat().st_mode & 0o777) == 0o700
        failure: str | None = None
        out = invocation.result_path
        for line in invocation.script.decode().splitlines():
            word, _, arg = line.partition(" ")
            if word == "sleep":
                await trio.sleep(float(arg))
            elif word == "write":
                out.write_text(arg)
            elif word == "fail":
                failure = arg
            elif word == "raise":
                raise RuntimeError("runner bug")
            elif word == "symlink":
                out.symlink_to(arg)
            elif word == "fifo":
                os.mkfifo(out)
            elif word == "big":
                out.write_bytes(b"1" * int(arg))
            elif word == "dir":
                out.mkdir()
            elif word == "nested":
                deep = invocation.workspace / "a" / "b"
                deep.mkdir(parents=True)
                (deep / "f").write_text("x")
                os.chmod(deep, 0o500)
        # As every runner does: the answer read once, with the checked reader.
        return RunReport(failure=failure, result=_answer(out, failure))


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class ProcessRunner:
    """Subprocess fake: ``python3 script`` in the workspace, answer in ``$QUERY_OUT``."""

    timeout_s: float = 30.0
    reconciled: int = 0
    closed: int = 0
    #: What :meth:`degradations` reports (tests set it).
    degraded: tuple[Degradation, ...] = ()

    def degradations(self) -> tuple[Degradation, ...]:
        return self.degraded

    async def watch(self) -> Degradation:
        await trio.sleep_forever()  # nothing to lose
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self.closed += 1

    async def preflight(self) -> None:
        return None

    async def reconcile(self) -> int:
        self.reconciled += 1
        return 0

    async def warm(self, seed_dirs: Iterable[Path]) -> dict[str, bool]:
        del seed_dirs  # nothing to prepare
        return {}

    async def prepare(self, seed_dir: Path, work_root: Path) -> None:
        del seed_dir, work_root  # nothing to prepare

    async def run(self, invocation: Invocation) -> RunReport:
        script = invocation.workspace / ".query-script.py"
        script.write_bytes(invocation.script)
        env = {
            "QUERY_OUT": str(invocation.result_path),
            "QUERY_REPO": str(invocation.seed_dir),
            "PATH": "/usr/bin:/bin",
        }
        with trio.move_on_after(self.timeout_s) as scope:
            proc = await trio.run_process(
                [sys.executable, "-I", "-S", str(script)],
                cwd=str(invocation.workspace),
                env=env,
                check=False,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        if scope.cancelled_caught:
            return RunReport(failure="query-timeout")
        if proc.returncode != 0:
            return RunReport(failure="query-nonzero-exit")
        return RunReport(result=_answer(invocation.result_path, None))


def process_runner_factory(config: object) -> ProcessRunner:
    """For ``run_server(..., runner_factory=...)`` in test entry points."""
    timeout = getattr(config, "timeout_s", 30)
    return ProcessRunner(timeout_s=float(timeout))


__all__ = ["ProcessRunner", "ScriptedRunner", "process_runner_factory"]
