"""Issue 4 item 5, first layer: every attack straight through the runner.

The outcome is computed exactly as the broker does it: the runner's report,
then the broker's own result reader (O_NOFOLLOW, regular file, size cap) and
strict output check against the boolean schema. Each attack's outcome is
printed. The same attacks run through the real broker in
``test_adversarial_broker.py``.
"""

from __future__ import annotations

import pytest

from bounded_query.broker.protocol import check_output, parse_schema
from bounded_query.sandbox import DockerRunner
from tests.sandbox.attacks import ATTACKS
from tests.sandbox.helpers import (
    RUNTIMES,
    leftover_containers,
    leftover_volumes,
    new_invocation,
    settings,
)

pytestmark = pytest.mark.engine

BOOLEAN = parse_schema({"type": "boolean"})
#: Short timeout so the spinning attacks end quickly (the minimum is 1 s).
TIMEOUT_S = 3
MEMORY = 256 * 1024**2


def report_line(capsys, text: str) -> None:
    """Print past pytest's capture, so every run lists every attack."""
    with capsys.disabled():
        print("\n" + text, end="")


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
async def test_attack_through_runner(capsys, engine, seed, work_root, runtime, attack):
    cfg = settings(runtime, timeout_s=TIMEOUT_S, memory=MEMORY)
    runner = DockerRunner(cfg)
    invocation = new_invocation(cfg, work_root, seed, attack.source)
    try:
        report = await runner.run(invocation)
        raw = report.result
        assert leftover_volumes(engine, cfg.run_id, role="query-repo") == []
        await runner.reconcile()
    finally:
        runner.close()
    assert leftover_volumes(engine, cfg.run_id) == []
    canonical = None if report.failure or raw is None else check_output(raw, BOOLEAN)
    outcome = "error" if canonical is None else canonical
    detail = report.failure or ("invalid-output" if canonical is None else "ok")
    report_line(
        capsys,
        f"  attack {attack.name:<22} {runtime:<6} -> {outcome:<5} ({detail}, "
        f"wait {report.phases.get('wait', 0.0):.2f}s)",
    )
    assert leftover_containers(engine, cfg.run_id) == []
    assert outcome in attack.expect, (attack.name, report, raw[:100] if raw else raw)
