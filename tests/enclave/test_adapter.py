"""The enclave adapter's pure parts: the prompt, answer extraction, the engine command line."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bounded_query.broker.protocol import policy
from bounded_query.sandbox import enclave_adapter as adapter
from bounded_query.sandbox import enclave_spec

SCHEMA = '{"type":"object","fields":{"found":{"type":"boolean"}}}'
task_text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _report(result: object, **extra: object) -> bytes:
    value = {"type": "result", "subtype": "success", "is_error": False, "result": result}
    value.update(extra)
    return json.dumps(value).encode()


@given(task_text)
def test_prompt_holds_the_task_verbatim_once_after_the_fixed_parts(task: str) -> None:
    prompt = adapter.build_prompt(task, SCHEMA)
    head, tail = prompt.split("----- BEGIN TASK -----\n", 1)
    assert tail == task + "\n----- END TASK -----\n"
    assert adapter.PROMPT_INSTRUCTION in head
    assert '{"fields":{"found":{"type":"boolean"}},"type":"object"}' in head
    # Nothing in the fixed part depends on the task.
    assert head == adapter.build_prompt("", SCHEMA).split("----- BEGIN TASK -----\n", 1)[0]


@given(st.text(min_size=1, max_size=30))
def test_schema_layout_never_reaches_the_prompt(padding: str) -> None:
    spaced = json.dumps(json.loads(SCHEMA), indent=4)
    assert adapter.build_prompt("t", spaced) == adapter.build_prompt("t", SCHEMA)


def test_prompt_refusals() -> None:
    with pytest.raises(adapter.AdapterError, match="NUL"):
        adapter.build_prompt("a\x00b", SCHEMA)
    with pytest.raises(adapter.AdapterError, match="larger"):
        adapter.build_prompt("x" * (adapter.MAX_TASK_BYTES + 1), SCHEMA)
    adapter.build_prompt("é" * (adapter.MAX_TASK_BYTES // 2), SCHEMA)
    with pytest.raises(adapter.AdapterError, match="larger"):
        adapter.build_prompt("é" * (adapter.MAX_TASK_BYTES // 2 + 1), SCHEMA)
    with pytest.raises(adapter.AdapterError, match="not JSON"):
        adapter.build_prompt("t", "{")


@given(
    json_values, st.sampled_from(["", " ", "\n", "\n\n  "]), st.sampled_from(["", "json", "JSON"])
)
def test_answer_is_the_one_json_value_without_whitespace_or_fence(
    value: object, space: str, info: str
) -> None:
    text = json.dumps(value)
    assert adapter.extract_answer(_report(space + text + space)) == text.encode()
    fenced = f"{space}```{info}\n{text}\n```{space}"
    assert adapter.extract_answer(_report(fenced)) == text.encode()


@pytest.mark.parametrize(
    "answer",
    [
        "The answer is true",
        "true false",
        "```json\ntrue\n```\n```json\nfalse\n```",  # two fences: not one value
        "``` json with words\ntrue\n```",
        "",
        "```json\n```",
    ],
)
def test_answer_that_is_not_one_json_value_is_refused(answer: str) -> None:
    with pytest.raises(adapter.AdapterError):
        adapter.extract_answer(_report(answer))


@pytest.mark.parametrize(
    "stdout",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[]",
        json.dumps({"type": "assistant", "result": "true", "is_error": False}).encode(),
        _report("true", is_error=True),
        _report(True),
        json.dumps({"type": "result", "result": "true"}).encode(),  # is_error missing
        _report("x" * (adapter.MAX_RESULT_BYTES + 1)),
    ],
)
def test_engine_report_that_is_not_a_successful_result_is_refused(stdout: bytes) -> None:
    with pytest.raises(adapter.AdapterError):
        adapter.extract_answer(stdout)


def test_oversized_engine_report_is_refused_before_parsing() -> None:
    with pytest.raises(adapter.AdapterError, match="too large"):
        adapter.extract_answer(b" " * (adapter.MAX_ENGINE_STDOUT_BYTES + 1))


def test_answer_at_the_output_limit_is_kept() -> None:
    text = json.dumps("x" * (adapter.MAX_RESULT_BYTES - 2))
    assert adapter.extract_answer(_report(text)) == text.encode()


def test_engine_command_line_is_fixed() -> None:
    argv = adapter.engine_argv("claude", "some-model", "PROMPT")
    assert argv[0] == adapter.ENGINE_BINARIES["claude"]
    assert argv[1:3] == ["-p", "PROMPT"]

    def value(flag: str) -> str:
        assert argv.count(flag) == 1
        return argv[argv.index(flag) + 1]

    assert value("--model") == "some-model"
    assert value("--tools") == "Bash,Read"
    assert value("--allowedTools") == "Bash,Read"
    assert value("--setting-sources") == ""
    assert value("--permission-mode") == "bypassPermissions"
    assert value("--mcp-config") == '{"mcpServers":{}}'
    assert value("--output-format") == "json"
    for flag in ("--strict-mcp-config", "--no-session-persistence", "--disable-slash-commands"):
        assert flag in argv
    assert argv.count("PROMPT") == 1


@pytest.mark.parametrize(
    ("engine", "model"), [("gemini", "m"), ("claude", ""), ("claude", "--x"), ("copilot", "-x")]
)
def test_engine_command_line_refusals(engine: str, model: str) -> None:
    with pytest.raises(adapter.AdapterError):
        adapter.engine_argv(engine, model, "p")


def test_engine_environment_passes_only_fixed_variables() -> None:
    environ = {
        "PATH": "/opt/engine/bin:/usr/bin:/bin",
        "HOME": "/agent/home",
        "ANTHROPIC_BASE_URL": "http://awf-api-proxy:8080",
        "ANTHROPIC_API_KEY": "ab" * 32,
        "LD_PRELOAD": "/tmp/x.so",
        "CLAUDE_CONFIG_DIR": "/awf/seed/.claude",
        "DISABLE_AUTOUPDATER": "0",
    }
    env = adapter.engine_env("claude", environ)
    assert "LD_PRELOAD" not in env
    assert "CLAUDE_CONFIG_DIR" not in env
    assert env["DISABLE_AUTOUPDATER"] == "1"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CODE_DISABLE_CLAUDE_MDS"] == "1"
    assert env["ANTHROPIC_API_KEY"] == "ab" * 32
    with pytest.raises(adapter.AdapterError):
        adapter.engine_env("gemini", environ)


def test_adapter_copies_of_policy_and_spec_values() -> None:
    """The adapter runs alone in the image, so it restates these; they must agree."""
    assert adapter.MAX_TASK_BYTES == policy.ENCLAVE_MAX_TASK_BYTES
    assert adapter.MAX_RESULT_BYTES == policy.ENCLAVE_MAX_OUTPUT_BYTES
    assert adapter.ENGINES == policy.ENCLAVE_ENGINES
    assert enclave_spec.WORKSPACE_FILES["task.txt"] == adapter.TASK_PATH
    assert enclave_spec.WORKSPACE_FILES["schema.json"] == adapter.SCHEMA_PATH
    assert enclave_spec.WORKSPACE_FILES["result.json"] == adapter.RESULT_PATH
    assert enclave_spec.SEED_TARGET == adapter.SEED_DIR
    assert enclave_spec.ADAPTER_ENTRYPOINT[-1] == "/awf/adapter.py"
    assert set(enclave_spec.ENGINE_ENDPOINT_ENV) == set(adapter.ENGINES)
    for engine, (url_var, key_var) in enclave_spec.ENGINE_ENDPOINT_ENV.items():
        assert {url_var, key_var} <= set(adapter._ENDPOINT_ENV[engine])
