"""curl --unix-socket with exactly the reference wrapper's headers (issue #3 item 7).

The reference wrapper is a POSIX sh script around curl; a client written for
it must work against our broker unchanged: same route, same headers, the body
as raw bytes (``--data-binary @-``), one of the two canonical bodies back.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import trio

from bounded_query.broker.protocol import encode_schema_header

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")


def _curl_argv(socket_path, repo: str, schema: bytes) -> list[str]:
    """curl with exactly the reference wrapper's request shape."""
    return [
        "curl",
        "-sS",
        "--unix-socket",
        str(socket_path),
        "--max-time",
        "20",
        "-X",
        "POST",
        "-H",
        "X-AWF-Query-Version: 2",
        "-H",
        f"X-AWF-Repo: {repo}",
        "-H",
        f"X-AWF-Schema-B64: {encode_schema_header(schema).decode()}",
        "-H",
        "Content-Type: application/octet-stream",
        "--data-binary",
        "@-",
        "http://localhost/query",
    ]


async def _curl(socket_path, repo: str, schema: bytes, script: bytes, *, include: bool = False):
    argv = _curl_argv(socket_path, repo, schema)
    if include:
        argv.insert(1, "-i")
    start = time.monotonic()
    proc = await trio.run_process(argv, stdin=script, capture_stdout=True, check=False)
    return proc.returncode, proc.stdout, time.monotonic() - start


async def test_curl_small_request_ok(broker):
    code, out, _ = await _curl(broker.socket, "octo/public", b'{"type":"boolean"}', b"write true")
    assert code == 0
    assert out == b'{"status":"ok","result":true}'


async def test_curl_response_head_is_the_fixed_one(broker):
    _, out, _ = await _curl(
        broker.socket, "octo/internal", b'{"type":"boolean"}', b"write true", include=True
    )
    assert out == (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 29\r\n"
        b"connection: close\r\n\r\n"
        b'{"status":"ok","result":true}'
    )


async def test_curl_large_body_uses_expect_continue_without_stalling(broker):
    # curl sends "Expect: 100-continue" for bodies over 1 KiB and waits up to
    # one second for the interim response unless the server answers it.
    script = b"write 3\n#" + b"x" * 60000
    schema = b'{"type":"integer","minimum":0,"maximum":7}'
    code, out, elapsed = await _curl(broker.socket, "octo/public", schema, script)
    assert code == 0
    assert out == b'{"status":"ok","result":3}'
    assert elapsed < 0.9


async def test_curl_max_size_script_and_one_byte_more(broker):
    script = b"write true\n#" + b"x" * (65536 - 12)
    assert len(script) == 65536
    code, out, _ = await _curl(broker.socket, "octo/public", b'{"type":"boolean"}', script)
    assert (code, out) == (0, b'{"status":"ok","result":true}')
    code, out, _ = await _curl(broker.socket, "octo/public", b'{"type":"boolean"}', script + b"x")
    assert out == b'{"status":"error"}'


async def test_curl_errors_are_canonical(broker):
    cases = [
        ("octo/unknown", b'{"type":"boolean"}', b"write true"),
        ("octo/sealed", b'{"type":"const","value":1}', b"write 1"),
        ("octo/public", b'{"type":"string"}', b"write true"),
        ("octo/public", b'{"type":"boolean"}', b"write 7"),
        ("octo/public", b'{"type":"boolean"}', b""),
    ]
    for repo, schema, script in cases:
        _, out, _ = await _curl(broker.socket, repo, schema, script)
        assert out == b'{"status":"error"}', (repo, schema, script)


def test_curl_against_real_broker_process(tmp_path):
    import json
    import signal

    from tests.broker.helpers import make_root
    from tests.broker.procs import start_broker

    make_root(tmp_path)
    config_path = tmp_path / "broker.json"
    sock = json.loads(config_path.read_text())["socketPath"]
    proc = start_broker(config_path)
    try:
        script = "import os\nopen(os.environ['QUERY_OUT'], 'w').write(' [1, true] ')\n"
        schema = b'{"type":"tuple","items":[{"type":"const","value":1},{"type":"boolean"}]}'
        result = subprocess.run(
            _curl_argv(sock, "octo/public", schema),
            input=script.encode(),
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert result.stdout == b'{"status":"ok","result":[1,true]}'
        assert result.stderr == b""
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
