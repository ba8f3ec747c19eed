"""A budget bounds what is disclosed about *its* repository (issue 21 item 5), attacker side.

The attack: a run with a ``confidential`` repository (8 bits for the run)
and an ``internal`` one (64 bits). A query on the confidential repository
reads one hex digit of its secret file and creates that many batches of
pipes; the next query, on the *internal* repository, creates one pipe and
answers its inode number. On runc pipe inodes come from one kernel-wide
counter, so the difference between consecutive internal answers carries the
confidential digit: the confidential secret leaves on the internal budget,
and the 8-bit promise fails. Real scripts in real containers through the
real DockerRunner, one run (one runner, its page-cache pin, a tmpfs work
root as the harness's quota makes it), 32 trials (124 secret bits decoded
after the reference trial, so the 4.5-sigma chance test separates).

What the test asserts, on each runtime:

* the channel policy's verdict for this run (``internal`` + ``confidential``,
  as root, pinned): refused on runc, naming the inode counter and the flag;
  accepted degraded with the flag; accepted as is on gVisor;
* what the attacker measures: on runc the decoder beats coin flips (the
  channel the policy refuses is really there); on gVisor (its own kernel per
  sandbox) it is at chance (the run the policy accepts leaks nothing here).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
import trio

from bounded_query.broker.mounts import mount_tmpfs, unmount
from bounded_query.broker.workspace import remove_tree
from bounded_query.harness.configuration.channel_policy import ALLOW_FLAG, channel_decision
from bounded_query.sandbox import DockerRunner
from bounded_query.sandbox.storage import tmpfs_quota
from tests.sandbox import channels
from tests.sandbox.helpers import (
    RUNTIMES,
    make_seed,
    new_invocation,
    remove_seed,
    settings,
)

pytestmark = pytest.mark.engine

TRIALS = 32
#: Pipes per unit of the digit: four times the issue-9 bench's, so that the
#: other pipes the host creates meanwhile (busy CI neighbours) stay noise.
STEP = 4 * channels.STEP_PIPES
#: The run's repositories, in configuration order.
RUN = ("internal", "confidential")

#: On the confidential repository: leak digit INDEX of its secret through the
#: kernel's pipe inode counter (STEP pipes per unit), answer nothing useful.
ENCODER = """
import json, os
digit = int(open("/query/repo/SECRET").read().strip()[__INDEX__], 16)
for _ in range(digit * __STEP__):
    r, w = os.pipe(); os.close(r); os.close(w)
json.dump(True, open("/query/out", "w"))
"""
#: On the internal repository: the next pipe's inode number is the answer.
DECODER = """
import json, os
r, w = os.pipe()
json.dump(os.fstat(r).st_ino, open("/query/out", "w"))
"""


def _seed_with_secret(path: Path, secret: str) -> Path:
    make_seed(path)
    path.chmod(0o755)
    (path / "SECRET").write_text(secret + "\n")
    (path / "SECRET").chmod(0o444)
    path.chmod(0o555)
    return path


async def _attack(runtime: str, confidential: Path, internal: Path, work: Path) -> list[float]:
    cfg = settings(runtime, memory=512 * 1024**2)
    runner = DockerRunner(cfg)
    readings: list[float] = []
    try:
        await runner.warm([confidential, internal])
        assert runner.page_cache_pinned is True
        for index in range(TRIALS):
            script = ENCODER.replace("__INDEX__", str(index))
            enc = new_invocation(cfg, work, confidential, script.replace("__STEP__", str(STEP)))
            assert (await runner.run(enc)).failure is None
            assert remove_tree(enc.workspace)
            dec = new_invocation(cfg, work, internal, DECODER)
            decoded = await runner.run(dec)
            assert decoded.failure is None
            assert runner.isolated_storage is True
            readings.append(float(json.loads(decoded.result or b"-1")))
            assert remove_tree(dec.workspace)
    finally:
        with trio.CancelScope(shield=True):
            await runner.reconcile()
        runner.close()
    return readings


@pytest.fixture(scope="module", params=RUNTIMES)
def attacked(request, engine, tmp_path_factory):
    base = tmp_path_factory.mktemp(f"budget-{request.param}")
    base.chmod(0o755)
    secret = secrets.token_hex(TRIALS // 2)  # 32 hex digits: 128 bits the 8-bit budget guards
    confidential = _seed_with_secret(base / "confidential", secret)
    internal = make_seed(base / "internal")
    work = base / "work"
    work.mkdir(mode=0o700)
    mount_tmpfs(work, tmpfs_quota(256 * 1024**2).options)
    try:
        readings = trio.run(_attack, request.param, confidential, internal, work)
    finally:
        unmount(work)
        remove_seed(confidential)
        remove_seed(internal)
    digits = [int(c, 16) for c in secret]
    guess = channels.decode_magnitude(digits, readings)
    correct = channels.correct_bits(digits[1:], guess)
    total = channels.BITS * (TRIALS - 1)
    cap = channels.capacity_bits(correct, total)
    print(
        f"  {request.param:7} confidential -> internal via pipe inodes: {correct}/{total}"
        f" bits, {cap:.2f}/trial"
    )
    return request.param, correct, total


def test_the_policy_refuses_what_the_attacker_can_do(attacked):
    runtime, correct, total = attacked
    refused = channel_decision(runtime, RUN, isolated_storage=True, allow_open=False, pinned=True)
    allowed = channel_decision(runtime, RUN, isolated_storage=True, allow_open=True, pinned=True)
    if runtime == "docker":
        # Before: the channel is there, the decoder reads the confidential digits.
        assert not channels.at_chance(correct, total), (correct, total)
        assert correct > total * 3 // 4, (correct, total)
        # After: the policy refuses the run, or accepts it only degraded.
        assert refused.problem is not None
        assert "inode" in refused.problem.message
        assert ALLOW_FLAG in refused.problem.hint
        assert allowed.degraded is not None
        assert "inode" in allowed.degraded
    else:
        # gVisor with per-invocation storage and the pin: accepted, and nothing crosses.
        assert channels.at_chance(correct, total), (correct, total)
        assert refused.problem is None
        assert refused.degraded is None
