"""``bounded-query-api-proxy`` as a real process: proxy variables ignored, start-up refusals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import trio

from tests.apiproxy.fake_upstream import FakeUpstream
from tests.apiproxy.helpers import (
    CREDENTIAL,
    anthropic_body,
    config_doc,
    control,
    free_port,
    new_invocation,
    raw_exchange,
    request_bytes,
    status_of,
)

_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")


def _files(tmp_path, upstream_url: str, port: int, mode: int = 0o400):
    config = tmp_path / "proxy.json"
    config.write_text(json.dumps(config_doc(tmp_path, upstream_url, port)))
    key = tmp_path / "key"
    key.write_bytes(CREDENTIAL + b"\n")
    os.chmod(key, mode)
    return config, key


def _argv(config, key) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bounded_query.broker.apiproxy",
        "--config",
        str(config),
        "--credential-file",
        str(key),
    ]


async def _read_until(stream, needle: bytes, seen: bytearray) -> None:
    with trio.fail_after(30):
        while needle not in seen:
            data = await stream.receive_some(4096)
            if not data:
                raise AssertionError(f"process ended before {needle!r}: {bytes(seen)!r}")
            seen += data


async def test_the_process_ignores_proxy_variables_and_keeps_the_credential_out_of_stderr(
    tmp_path,
):
    upstream = FakeUpstream()
    trap = FakeUpstream()  # what HTTP_PROXY points at: it must see nothing
    async with trio.open_nursery() as nursery:
        await nursery.start(upstream.serve)
        await nursery.start(trap.serve)
        port = free_port()
        config, key = _files(tmp_path, upstream.url, port)
        env = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"}
        env.update(dict.fromkeys(_PROXY_VARIABLES, trap.url))
        process = await trio.lowlevel.open_process(
            _argv(config, key), env=env, stderr=subprocess.PIPE
        )
        assert process.stderr is not None
        stderr = bytearray()
        try:
            await _read_until(process.stderr, b"api-proxy-ready", stderr)
            invocation, placeholder = new_invocation()
            socket_path = tmp_path / "control" / "control.sock"
            status, doc = await control(
                socket_path,
                b"POST",
                b"/arm",
                {"invocation": invocation, "placeholder": placeholder},
            )
            assert (status, doc["outcome"]) == (200, "armed")
            response = await raw_exchange(port, request_bytes(port, placeholder, anthropic_body()))
            assert status_of(response) == 200
            assert len(upstream.requests) == 1
            assert upstream.requests[0].header(b"x-api-key") == [CREDENTIAL]
            assert trap.requests == []
            assert trap.connections == 0
            status, doc = await control(
                socket_path, b"POST", b"/disarm", {"invocation": invocation}
            )
            assert doc["outcome"] == "disarmed"
        finally:
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(30):
                while True:
                    data = await process.stderr.receive_some(4096)
                    if not data:
                        break
                    stderr += data
                code = await process.wait()
        assert code == 0
        assert b"api-proxy-stopped" in stderr
        assert CREDENTIAL not in stderr
        assert placeholder.encode() not in stderr
        usage = (tmp_path / "usage" / "usage.jsonl").read_bytes()
        assert CREDENTIAL not in usage
        assert placeholder.encode() not in usage
        assert not socket_path.exists()
        nursery.cancel_scope.cancel()


def test_a_credential_file_readable_by_others_stops_the_start(tmp_path):
    config, key = _files(tmp_path, "http://127.0.0.1:9", free_port(), mode=0o644)
    done = subprocess.run(_argv(config, key), capture_output=True, timeout=60, check=False)
    assert done.returncode == 2
    event = json.loads(done.stderr.splitlines()[-1])
    assert (event["event"], event["reason"]) == ("api-proxy-refused", "config")
    assert "0644" in event["detail"]
    assert CREDENTIAL not in done.stderr
    assert not (tmp_path / "control").exists()


def test_a_bad_configuration_stops_the_start(tmp_path):
    config, key = _files(tmp_path, "http://127.0.0.1:9", free_port())
    doc = json.loads(config.read_text())
    doc["upstream"]["allowInsecure"] = False
    config.write_text(json.dumps(doc))
    done = subprocess.run(_argv(config, key), capture_output=True, timeout=60, check=False)
    assert done.returncode == 2
    assert b"allowInsecure" in done.stderr
