"""The pinned copilot engine (1.0.102, BYOK openai) talks to its model through the proxy.

Spec 15.2 calls ``maxModelRequests``/``maxModelTokens`` "not an enforcement
boundary" for copilot because the CLI has no such controls; behind the API
proxy they are one. The real binary runs with ``COPILOT_PROVIDER_BASE_URL``
at the proxy and the placeholder as its key; the scripted provider answers
turn 1 with a ``bash`` tool call printing a marker file and the final
answer only once the marker came back. Copilot sends no token field at all:
the proxy adds ``max_completion_tokens`` at the bound and pins ``store``
off.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import trio

from bounded_query.broker.apiproxy import decode_record
from tests.apiproxy.fake_upstream import FakeUpstream, Recorded
from tests.apiproxy.helpers import CREDENTIAL, running_proxy

TOOLS_DIR = Path(os.environ.get("BQ_TEST_TOOLS", "/opt/bq-test-tools"))
MARKER = "marker-c0p1l07"
MODEL = "gpt-test-model"
ENGINE_TIMEOUT_S = 120


def _copilot() -> str:
    path = TOOLS_DIR / "node_modules" / ".bin" / "copilot"
    if path.exists():
        return str(path)
    reason = f"copilot is not installed in {TOOLS_DIR}: run .ci/install-test-tools"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def _script(seed: Path):
    def answer(recorded: Recorded) -> dict:
        if MARKER in json.dumps(recorded.json()["messages"]):
            return {"role": "assistant", "content": f"found {MARKER}"}
        arguments = json.dumps({"command": f"cat {seed}", "description": "read the seed"})
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "bash", "arguments": arguments},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    return answer


async def test_copilot_runs_its_tool_loop_through_the_proxy(tmp_path):
    copilot = _copilot()
    work = Path(tempfile.mkdtemp(prefix="bq-apiproxy-copilot-"))
    try:
        seed = work / "seed.txt"
        seed.write_text(MARKER + "\n")
        home = work / "home"
        home.mkdir()
        upstream = FakeUpstream(mode="json", json_script=_script(seed))
        overrides = {"engine": "copilot", "model": MODEL, "maxModelRequests": 4}
        async with running_proxy(tmp_path, upstream, **overrides) as run:
            _, placeholder = await run.arm()
            env = {
                "PATH": "/usr/bin:/bin",
                "HOME": str(home),
                "COPILOT_OFFLINE": "true",
                "COPILOT_PROVIDER_BASE_URL": f"http://127.0.0.1:{run.port}/v1",
                "COPILOT_PROVIDER_TYPE": "openai",
                "COPILOT_PROVIDER_API_KEY": placeholder,
                "COPILOT_MODEL": MODEL,
                "COPILOT_AUTO_UPDATE": "false",
            }
            argv = [
                copilot, "-p", "Print the marker in seed.txt", "--silent", "--stream", "off",
                "--no-color", "--no-ask-user", "--no-auto-update", "--no-custom-instructions",
                "--no-remote", "--disable-builtin-mcps", "--allow-all-tools", "--allow-all-paths",
            ]  # fmt: skip
            with trio.fail_after(ENGINE_TIMEOUT_S):
                done = await trio.run_process(
                    argv, env=env, cwd=str(work), capture_stdout=True, capture_stderr=True,
                    check=False, stdin=subprocess.DEVNULL,
                )  # fmt: skip
            assert done.returncode == 0, done.stderr[-2000:]
            assert f"found {MARKER}".encode() in done.stdout
            assert len(upstream.requests) == 2
            for seen in upstream.requests:
                assert seen.target == b"/v1/chat/completions"
                assert seen.header(b"authorization") == [b"Bearer " + CREDENTIAL]
                sent = seen.json()
                assert sent["model"] == MODEL
                assert sent["max_completion_tokens"] == 1024
                assert sent["store"] is False
                assert placeholder.encode() not in seen.body
            records = [decode_record(line) for line in run.usage_lines()]
            assert [r.category for r in records] == ["forwarded", "forwarded"]
            assert CREDENTIAL not in done.stdout + done.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)
