"""The adapter's copilot branch and the copilot enclave spec, as pure values (no container)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bounded_query.broker.protocol import policy
from bounded_query.sandbox import enclave_adapter as adapter
from bounded_query.sandbox import enclave_spec
from bounded_query.sandbox.spec import MASKED_PATHS

PLACEHOLDER = "ab" * 32


def _events(*events: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def _message(content: str, tool_requests: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "type": "assistant.message",
        "data": {"content": content, "toolRequests": tool_requests or []},
    }


RESULT_OK = {"type": "result", "exitCode": 0}
TOOL_CALL = {"toolCallId": "c1", "name": "bash", "arguments": {"command": "cat x"}}


def test_copilot_answer_is_the_last_message_content() -> None:
    stream = _events(
        {"type": "session.info", "data": {}},
        _message("", [TOOL_CALL]),
        {"type": "tool.execution_complete", "data": {"result": {"content": '{"x": 1}'}}},
        _message('```json\n{"found": true, "note": "*y* `z`"}\n```'),
        {"type": "assistant.turn_end", "data": {}},
        RESULT_OK,
    )
    answer = adapter.extract_answer(stream, "copilot")
    assert answer == b'{"found": true, "note": "*y* `z`"}'


@pytest.mark.parametrize(
    ("stream", "reason"),
    [
        (_events(_message("true")), "does not end in a result event"),
        (_events(_message("true"), {"type": "result", "exitCode": 1}), "ended in an error"),
        (_events(_message("true"), {"type": "result", "exitCode": True}), "ended in an error"),
        (_events(_message("true"), {"type": "result"}), "ended in an error"),
        (_events(RESULT_OK), "no final answer"),
        (_events(_message("true", [TOOL_CALL]), RESULT_OK), "not a final answer"),
        (_events({"type": "assistant.message", "data": {}}, RESULT_OK), "no final answer"),
        (_events(_message("The answer is true."), RESULT_OK), "not one JSON value"),
        (b"not json\n" + _events(_message("true"), RESULT_OK), "not JSON"),
        (b"[1]\n" + _events(_message("true"), RESULT_OK), "non-object"),
        (b"\xff\n", "not JSON"),
        (b"", "does not end in a result event"),
        # Claude's report is not copilot's stream.
        (
            json.dumps({"type": "result", "is_error": False, "result": "true"}).encode(),
            "ended in an error",
        ),
    ],
)
def test_copilot_output_without_a_final_answer_is_refused(stream: bytes, reason: str) -> None:
    with pytest.raises(adapter.AdapterError, match=reason):
        adapter.extract_answer(stream, "copilot")


def test_an_answer_for_an_unknown_engine_is_refused() -> None:
    with pytest.raises(adapter.AdapterError, match="unsupported engine"):
        adapter.extract_answer(_events(_message("true"), RESULT_OK), "gemini")


def test_copilot_answer_larger_than_the_bound_is_refused() -> None:
    big = json.dumps("x" * adapter.MAX_RESULT_BYTES)
    with pytest.raises(adapter.AdapterError, match="larger than"):
        adapter.extract_answer(_events(_message(big), RESULT_OK), "copilot")


def test_copilot_command_line() -> None:
    argv = adapter.engine_argv("copilot", "gpt-x", "the prompt")
    assert argv[:3] == ["/opt/engine/bin/copilot", "-p", "the prompt"]
    assert argv.count("the prompt") == 1
    assert "gpt-x" not in argv  # the model travels in COPILOT_MODEL
    for flag in (
        "--no-custom-instructions",
        "--disable-builtin-mcps",
        "--no-ask-user",
        "--no-auto-update",
        "--no-remote",
        "--allow-all-tools",
    ):
        assert flag in argv
    assert argv[argv.index("--output-format") + 1] == "json"
    assert argv[argv.index("--stream") + 1] == "off"
    assert f"--available-tools={','.join(adapter.COPILOT_TOOLS)}" in argv
    # Nothing that trusts the seed's configuration or widens the tools.
    for flag in ("--trust-folder", "--yolo", "--allow-all", "--allow-all-urls", "--add-dir"):
        assert flag not in argv
    assert not any(
        a.startswith(("--additional-mcp-config", "--plugin-dir", "--agent")) for a in argv
    )


def test_copilot_environment_is_fixed() -> None:
    environ = {
        "PATH": "/opt/engine/bin:/usr/bin:/bin",
        "HOME": "/agent/home",
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "COPILOT_PROVIDER_BASE_URL": "http://awf-api-proxy:8080/v1",
        "COPILOT_PROVIDER_API_KEY": PLACEHOLDER,
        # None of these may reach the engine.
        "ANTHROPIC_API_KEY": "x",
        "COPILOT_ALLOW_ALL": "true",
        "COPILOT_PROVIDER_API_KEY_COMMAND": "evil",
        "GH_TOKEN": "t",
        "COPILOT_CUSTOM_INSTRUCTIONS_DIRS": "/awf/seed",
    }
    env = adapter.engine_env("copilot", environ, "gpt-x")
    assert env["COPILOT_MODEL"] == "gpt-x"
    assert env["COPILOT_PROVIDER_API_KEY"] == PLACEHOLDER
    assert env["COPILOT_PROVIDER_BASE_URL"] == "http://awf-api-proxy:8080/v1"
    assert env["COPILOT_OFFLINE"] == "true"
    assert env["COPILOT_PROVIDER_TYPE"] == "openai"
    assert env["COPILOT_AUTO_UPDATE"] == "false"
    assert env["COPILOT_PKG_CACHE_HOME"] == adapter.COPILOT_PKG_CACHE
    for name in (
        "ANTHROPIC_API_KEY",
        "COPILOT_ALLOW_ALL",
        "COPILOT_PROVIDER_API_KEY_COMMAND",
        "GH_TOKEN",
        "COPILOT_CUSTOM_INSTRUCTIONS_DIRS",
    ):
        assert name not in env
    # claude's environment does not get copilot's endpoint, nor the reverse.
    claude = adapter.engine_env("claude", environ)
    assert "COPILOT_PROVIDER_API_KEY" not in claude
    assert claude["ANTHROPIC_API_KEY"] == "x"
    with pytest.raises(adapter.AdapterError):
        adapter.engine_env("copilot", environ, "")
    with pytest.raises(adapter.AdapterError):
        adapter.engine_env("copilot", environ, "--model")


def _settings(engine: str) -> enclave_spec.EnclaveSettings:
    return enclave_spec.EnclaveSettings(
        runtime="docker",
        run_id="ab" * 16,
        image=policy.ENCLAVE_IMAGES[engine],
        engine=engine,
        model="m",
        network="awf-bounded-agent",
        proxy_address="10.200.0.2",
        proxy_port=8080,
        memory_bytes=512 * 1024**2,
        nano_cpus=10**9,
        pids_limit=128,
        tmpfs_bytes=64 * 1024**2,
    )


def _body(engine: str) -> dict[str, Any]:
    invocation = enclave_spec.EnclaveInvocation(
        invocation_id="cd" * 8, seed_dir="/seeds/s", workspace="/ws/1", placeholder=PLACEHOLDER
    )
    return enclave_spec.enclave_spec(_settings(engine), invocation, "{}")[1]


def test_copilot_enclave_gets_the_constant_proc_stat_and_its_endpoint() -> None:
    body = _body("copilot")
    host = body["HostConfig"]
    mounts = {m["Target"]: m for m in host["Mounts"]}
    assert mounts["/proc/stat"]["Source"] == "/ws/1/proc-stat"
    assert mounts["/proc/stat"]["ReadOnly"] is True
    assert "/proc/stat" not in host["MaskedPaths"]
    assert set(host["MaskedPaths"]) == set(MASKED_PATHS) - {"/proc/stat"}
    assert "COPILOT_PROVIDER_BASE_URL=http://awf-api-proxy:8080/v1" in body["Env"]
    assert f"COPILOT_PROVIDER_API_KEY={PLACEHOLDER}" in body["Env"]
    assert body["Cmd"] == ["copilot", "m"]
    assert enclave_spec.workspace_files("copilot")["proc-stat"] == "/proc/stat"
    assert enclave_spec.engine_file_contents("copilot") == {
        "proc-stat": enclave_spec.PROC_STAT.encode()
    }
    assert enclave_spec.engine_file_contents("claude") == {}


def test_claude_enclave_is_unchanged_by_copilot() -> None:
    body = _body("claude")
    host = body["HostConfig"]
    assert "/proc/stat" not in {m["Target"] for m in host["Mounts"]}
    assert host["MaskedPaths"] == list(MASKED_PATHS)
    assert "ANTHROPIC_BASE_URL=http://awf-api-proxy:8080" in body["Env"]
    assert enclave_spec.workspace_files("claude") == enclave_spec.WORKSPACE_FILES


def test_proc_stat_is_constant_and_names_one_idle_cpu() -> None:
    """The synthetic file carries no host or invocation state: every counter is zero."""
    lines = enclave_spec.PROC_STAT.splitlines()
    assert [line.split()[0] for line in lines if line.startswith("cpu")] == ["cpu", "cpu0"]
    for line in lines:
        name, *values = line.split()
        expected = {"procs_running": ["1"]}.get(name, ["0"] * len(values))
        assert values == expected, line


def test_the_openai_fake_answers_only_after_the_marker_came_back() -> None:
    """The fake's script, pure: tool call first, the answer only for the marker, SSE reassembles."""
    from tests.fakes import openai_provider as fake

    script = fake.Script(
        {"command": "cat m", "marker": "MK", "answer": "yes", "wrong_answer": "no"}
    )
    tools = [{"type": "function", "function": {"name": "bash"}}]
    question: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
    first: dict[str, Any] = {"messages": question, "tools": tools}
    finish, message = fake.reply_for(script, first)
    assert finish == "tool_calls"
    (call,) = message["tool_calls"]
    assert json.loads(call["function"]["arguments"])["command"] == "cat m"
    back = [{"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": "x MK y"}]
    assert fake.reply_for(script, {**first, "messages": question + back}) == (
        "stop",
        {"role": "assistant", "content": "yes"},
    )
    wrong = [{"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": "nothing"}]
    assert fake.reply_for(script, {**first, "messages": question + wrong})[1]["content"] == "no"
    # No tool offered: no tool call, and no free pass either.
    assert fake.reply_for(script, {"messages": question}) == (
        "stop",
        {"role": "assistant", "content": "no"},
    )
    # The streamed form carries the same call.
    events = fake._stream("m", finish, message).decode().split("\n\n")
    assert events[-2] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-2] if e]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    arguments = "".join(
        d["tool_calls"][0]["function"].get("arguments", "") for d in deltas if "tool_calls" in d
    )
    assert arguments == call["function"]["arguments"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"


def test_an_event_stream_is_kept_from_its_end() -> None:
    """A long copilot run (tool output repeated in the stream) still yields its final answer."""
    limit = adapter.MAX_ENGINE_STDOUT_BYTES
    noise = json.dumps({"type": "tool.shell_output", "data": {"text": "x" * 50_000}}) + "\n"
    head = noise.encode() * (2 * limit // len(noise))
    stream = head + _events(_message('{"found": true}'), RESULT_OK)
    chunks = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]
    kept = adapter.bounded_output(chunks, tail=True)
    assert len(kept) <= limit
    assert kept.startswith(b'{"type": "tool.shell_output"')  # from a whole line on
    assert adapter.extract_answer(kept, "copilot") == b'{"found": true}'
    # The head of the same stream is too long to be an answer: refused, never cut.
    head_kept = adapter.bounded_output(chunks, tail=False)
    assert len(head_kept) > limit
    with pytest.raises(adapter.AdapterError, match="too large"):
        adapter.extract_answer(head_kept, "claude")
    # Short output is kept whole either way.
    assert adapter.bounded_output([b"a\n", b"b"], tail=True) == b"a\nb"
    assert adapter.bounded_output([b"a\n", b"b"], tail=False) == b"a\nb"
