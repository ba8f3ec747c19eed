"""Tests-only broker entry point with the subprocess fake runner.

``python -m tests.fakes.broker_main --config PATH`` (cwd = repository root).
Never installed: the shipped console script cannot select a fake runner.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bounded_query.broker.__main__ import run_server
from tests.fakes.runner import process_runner_factory

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--config":
        sys.exit(2)
    sys.exit(run_server(Path(sys.argv[2]), runner_factory=process_runner_factory))
