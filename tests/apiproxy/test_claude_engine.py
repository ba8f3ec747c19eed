"""The pinned claude engine (2.1.328) talks to its model through the proxy, unchanged.

The real native binary from ``.ci/install-test-tools`` runs as uid 65534
with ``ANTHROPIC_BASE_URL`` at the proxy and the placeholder as its key;
the scripted fake provider answers turn 1 with a ``Bash`` tool call that
prints a marker file and the final answer only once the marker came back in
a tool result (so a pass proves the engine's tool loop went through the
proxy twice, ENGINES.md). The engine's own request must pass every check
as it is: route, query, headers, strict JSON, model pin; its ``max_tokens``
(32000) arrives clamped and only the real credential reaches the provider.
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
from tests.apiproxy.fake_upstream import FakeUpstream, Recorded, anthropic_events
from tests.apiproxy.fake_upstream import anthropic_tool_use_events as tool_use
from tests.apiproxy.helpers import CREDENTIAL, MODEL, running_proxy

TOOLS_DIR = Path(os.environ.get("BQ_TEST_TOOLS", "/opt/bq-test-tools"))
MARKER = "marker-7f3a9c"
#: The engine starts in about a second; this is a safety net for a hung one.
ENGINE_TIMEOUT_S = 120


def _claude() -> str:
    path = TOOLS_DIR / "node_modules" / ".bin" / "claude"
    setpriv = shutil.which("setpriv")
    if path.exists() and setpriv is not None and os.geteuid() == 0:
        return str(path)
    reason = f"claude is not installed in {TOOLS_DIR} (or not root for setpriv)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def _script(seed: Path):
    def answer(recorded: Recorded) -> list[bytes]:
        body = json.dumps(recorded.json()["messages"])
        if MARKER in body:
            return anthropic_events(text=f"found {MARKER}")
        return tool_use("Bash", {"command": f"cat {seed}", "description": "read"})

    return answer


async def test_claude_runs_its_tool_loop_through_the_proxy(tmp_path):
    claude = _claude()
    work = Path(tempfile.mkdtemp(prefix="bq-apiproxy-claude-"))
    try:
        os.chmod(work, 0o755)
        seed = work / "seed.txt"
        seed.write_text(MARKER + "\n")
        home = work / "home"
        home.mkdir()
        os.chown(home, 65534, 65534)
        upstream = FakeUpstream(mode="scripted", script=_script(seed))
        async with running_proxy(tmp_path, upstream, maxModelRequests=4) as run:
            _, placeholder = await run.arm()
            env = {
                "PATH": "/usr/bin:/bin",
                "HOME": str(home),
                "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{run.port}",
                "ANTHROPIC_API_KEY": placeholder,
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1",
            }
            argv = [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                claude,
                "-p",
                "Print the marker in seed.txt",
                "--model",
                MODEL,
                "--output-format",
                "json",
                "--tools",
                "Bash,Read",
                "--permission-mode",
                "bypassPermissions",
                "--no-session-persistence",
            ]
            with trio.fail_after(ENGINE_TIMEOUT_S):
                done = await trio.run_process(
                    argv,
                    env=env,
                    cwd=str(work),
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                    stdin=subprocess.DEVNULL,
                )
            assert done.returncode == 0, done.stderr[-2000:]
            assert json.loads(done.stdout)["result"] == f"found {MARKER}"
            assert len(upstream.requests) == 2
            for seen in upstream.requests:
                assert seen.target == b"/v1/messages?beta=true"
                assert seen.header(b"x-api-key") == [CREDENTIAL]
                sent = seen.json()
                assert sent["model"] == MODEL
                assert sent["max_tokens"] == 1024
                assert {t["name"] for t in sent["tools"]} >= {"Bash", "Read"}
                assert placeholder.encode() not in seen.body
            records = [decode_record(line) for line in run.usage_lines()]
            assert [r.category for r in records] == ["forwarded", "forwarded"]
            assert all(r.clamped for r in records)
            assert CREDENTIAL not in done.stdout + done.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)
