"""The pinned codex engine (0.169.0) gets its Responses request through the proxy's checks.

Only the request side: the fake provider refuses with a 400 (a real
Responses stream is the enclave step's business). What this pins down is
that codex's own request passes route, strict JSON and model pin as it is,
that it carries hosted tools the proxy strips, and that it sends no
``max_output_tokens`` of its own (the proxy adds it at the bound) and
``store: false``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import trio

from bounded_query.broker.apiproxy import decode_record
from tests.apiproxy.fake_upstream import FakeUpstream
from tests.apiproxy.helpers import CREDENTIAL, running_proxy

TOOLS_DIR = Path(os.environ.get("BQ_TEST_TOOLS", "/opt/bq-test-tools"))
MODEL = "gpt-test-model"
ENGINE_TIMEOUT_S = 120


def _codex() -> str:
    path = TOOLS_DIR / "node_modules" / ".bin" / "codex"
    if path.exists():
        return str(path)
    reason = f"codex is not installed in {TOOLS_DIR}: run .ci/install-test-tools"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


async def test_codex_requests_pass_the_checks_with_hosted_tools_stripped(tmp_path):
    codex = _codex()
    work = Path(tempfile.mkdtemp(prefix="bq-apiproxy-codex-"))
    try:
        (work / "home").mkdir()
        upstream = FakeUpstream(mode="status", status=400)
        overrides = {"engine": "codex", "model": MODEL, "maxModelRequests": 2}
        async with running_proxy(tmp_path, upstream, **overrides) as run:
            _, placeholder = await run.arm()
            env = {"PATH": "/usr/bin:/bin", "HOME": str(work / "home"), "PROXY_KEY": placeholder}
            provider = "model_providers.proxy"
            argv = [
                codex, "exec", "--skip-git-repo-check", "--ephemeral", "--ignore-user-config",
                "--color", "never", "-m", MODEL, "--dangerously-bypass-approvals-and-sandbox",
                "-c", "model_provider=proxy",
                "-c", f'{provider}.name="proxy"',
                "-c", f'{provider}.base_url="http://127.0.0.1:{run.port}/v1"',
                "-c", f'{provider}.env_key="PROXY_KEY"',
                "-c", f'{provider}.wire_api="responses"',
                "-c", "check_for_update_on_startup=false", "-c", "analytics.enabled=false",
                "-c", "features.remote_models=false",
                "-c", "features.plugin_discovery_prefetch=false",
                "say hi",
            ]  # fmt: skip
            with trio.fail_after(ENGINE_TIMEOUT_S):
                await trio.run_process(
                    argv, env=env, cwd=str(work), capture_stdout=True, capture_stderr=True,
                    check=False, stdin=subprocess.DEVNULL,
                )  # fmt: skip
            assert upstream.requests
            for seen in upstream.requests:
                assert seen.target == b"/v1/responses"
                assert seen.header(b"authorization") == [b"Bearer " + CREDENTIAL]
                sent = seen.json()
                assert sent["model"] == MODEL
                assert sent["max_output_tokens"] == 1024
                assert (sent["store"], sent["background"]) == (False, False)
                kinds = {tool["type"] for tool in sent["tools"]}
                assert kinds <= {"function", "custom", "local_shell"}
                assert placeholder.encode() not in seen.body
            records = [decode_record(line) for line in run.usage_lines()]
            assert records[0].category == "upstream-status"
            assert records[0].tools_stripped >= 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
