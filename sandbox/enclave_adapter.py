"""The in-enclave adapter of a bounded agent (spec 15.5): run the engine, keep one JSON value.

Theory of operation: the enclave image's fixed entrypoint is
``python3 -I -S /awf/adapter.py ENGINE MODEL``. This file is copied into the
image at ``/awf/adapter.py``; it is standard-library only and runs as uid
65534 inside the enclave. It is **not** a trust boundary: everything it does
could be done by the engine itself (which runs arbitrary shell commands), so
the broker trusts nothing it writes and validates the result file strictly
(spec 15.5). Its job is convenience and determinism:

1. read the task (UTF-8 text, the caller's bytes verbatim) and the schema
   (JSON) from their read-only files;
2. build the fixed prompt (:func:`build_prompt`): the task verbatim between
   fixed framing, the schema, and the fixed instructions; nothing else, in
   particular nothing from the repository;
3. run the engine non-interactively with the working directory at the
   read-only seed, only its shell and file-read tools, no MCP server and no
   settings or instructions loaded from the repository or from any user or
   project scope (:func:`engine_argv`, :func:`engine_env`), HOME on the
   ``/agent`` tmpfs;
4. take the final answer from the engine's JSON output (Claude Code's one
   report object, Copilot's JSONL event stream) and reduce it to one JSON
   value (:func:`extract_answer`: surrounding whitespace and one Markdown
   code fence removed; the same rule for every engine), and write it to the
   result file. Anything else leaves the result file empty, which the broker
   answers with the canonical error.

The pure parts (:func:`build_prompt`, :func:`extract_answer`,
:func:`engine_argv`, :func:`engine_env`) take and return plain values and
are unit-tested outside the enclave (``tests/enclave/test_adapter.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "ENGINES",
    "ENGINE_BINARIES",
    "MAX_ENGINE_STDOUT_BYTES",
    "MAX_SCHEMA_BYTES",
    "MAX_TASK_BYTES",
    "PROMPT_INSTRUCTION",
    "AdapterError",
    "bounded_output",
    "build_prompt",
    "engine_argv",
    "engine_env",
    "extract_answer",
    "main",
]

#: The engines this adapter can drive (their ``boundedAgents.engine`` names).
ENGINES = ("claude", "copilot")
#: Where each engine's binary lives in its enclave image
#: (``sandbox/enclave_image/build.sh``).
ENGINE_BINARIES: Mapping[str, str] = {
    "claude": "/opt/engine/bin/claude",
    "copilot": "/opt/engine/bin/copilot",
}
#: Where the copilot image holds the package its single executable would
#: otherwise unpack (235 MB) into HOME on every run: build.sh unpacks it
#: there, read-only, at build time.
COPILOT_PKG_CACHE = "/opt/engine/cache"
#: Copilot's tools offered to the model: its shell (and the calls that read
#: or stop a long-running command) and its read-only file tools. Left out:
#: sub-agents (``task`` and friends), skills, SQL session stores, its own
#: documentation fetcher, and every editing tool.
COPILOT_TOOLS = ("bash", "read_bash", "stop_bash", "list_bash", "view", "rg", "glob")
#: The fixed in-enclave paths (``sandbox/enclave_spec.py`` mounts them).
SEED_DIR = "/awf/seed"
TASK_PATH = "/awf/task.txt"
SCHEMA_PATH = "/awf/schema.json"
RESULT_PATH = "/agent/result.json"
#: spec 15.2 ``maxTaskBytes`` is at most 65536; the broker enforces the
#: configured bound, this one keeps the prompt inside one argv string
#: (Linux's MAX_ARG_STRLEN is 128 KiB).
MAX_TASK_BYTES = 65536
#: The schema header limit of spec 14.3 (4096 bytes) with room to spare.
MAX_SCHEMA_BYTES = 16384
#: spec 15.2 ``maxOutputBytes`` is at most 8192; larger answers are dropped.
MAX_RESULT_BYTES = 8192
#: The engine's JSON report is read up to this size; a longer one is not an
#: answer (the final answer is at most a few KiB of it). Of an event stream
#: (copilot's JSONL, whose every tool output travels in it two or three
#: times) only the last this many bytes are kept, from the first whole line:
#: the final message and the result event end the stream.
MAX_ENGINE_STDOUT_BYTES = 4 * 1024 * 1024
#: The engines whose output is an event stream read from its end.
_STREAMING_OUTPUT = frozenset({"copilot"})
#: The fixed instruction of every prompt (spec 15.3: the task is forwarded
#: verbatim; everything around it is ours).
PROMPT_INSTRUCTION = (
    "The repository is read-only at the working directory; "
    "answer with one JSON value conforming to the schema."
)
_PROMPT_HEAD = (
    "You are answering one question about the repository in the current working "
    "directory ({seed}). You may read files and run read-only shell commands there. "
    "{instruction}\n"
    "Your final message must be exactly one JSON value and nothing else: no prose, "
    "no explanation. A Markdown code fence around it is tolerated.\n\n"
    "The response schema (bounded-query schema JSON; an object with a 'type' "
    "field describes the allowed values):\n{schema}\n\n"
    "The task, verbatim between the two marker lines:\n"
    "----- BEGIN TASK -----\n"
)
_PROMPT_TAIL = "\n----- END TASK -----\n"


class AdapterError(ValueError):
    """The enclave's inputs or the engine's output cannot produce an answer.

    Whose fault: the caller's task or schema (not text, too large), or the
    engine's run (no final answer, not one JSON value). Never a reason to
    write a partial result.
    """


def build_prompt(task: str, schema_text: str, seed_dir: str = SEED_DIR) -> str:
    """The fixed prompt for ``task`` under ``schema_text`` (spec 15.3).

    The task appears verbatim exactly once, after the fixed framing and the
    schema; the schema is re-serialized compactly so its layout carries no
    instruction. Nothing else varies.

    Raises:
        AdapterError: the task holds a NUL (it could not travel in argv) or
            is larger than :data:`MAX_TASK_BYTES`; the schema is not JSON.
    """
    if "\x00" in task:
        raise AdapterError("task contains a NUL character")
    if len(task.encode("utf-8", "surrogatepass")) > MAX_TASK_BYTES:
        raise AdapterError(f"task is larger than {MAX_TASK_BYTES} bytes")
    try:
        schema = json.loads(schema_text)
    except ValueError as exc:
        raise AdapterError(f"schema is not JSON: {exc}") from None
    compact = json.dumps(schema, separators=(",", ":"), sort_keys=True, ensure_ascii=True)
    head = _PROMPT_HEAD.format(seed=seed_dir, instruction=PROMPT_INSTRUCTION, schema=compact)
    return head + task + _PROMPT_TAIL


def _strip_fence(text: str) -> str:
    """``text`` without one enclosing Markdown code fence (```lang ... ```)."""
    if not (text.startswith("```") and text.endswith("```") and len(text) >= 6):
        return text
    first_newline = text.find("\n")
    if first_newline < 0:
        return text
    info = text[3:first_newline].strip()
    # An info string is one word (``json``); anything else is not a fence.
    if info and not info.replace("-", "").replace("_", "").isalnum():
        return text
    body = text[first_newline + 1 : -3]
    if "```" in body:
        return text
    return body.strip()


def _claude_final_text(report_text: str) -> str:
    """The final message of Claude Code's ``--output-format json`` report.

    One JSON object whose ``type`` is ``"result"``, ``is_error`` false and
    ``result`` the final message text.
    """
    try:
        report = json.loads(report_text)
    except ValueError:
        raise AdapterError("engine report is not JSON") from None
    if not isinstance(report, dict) or report.get("type") != "result":
        raise AdapterError("engine report is not a result object")
    if report.get("is_error") is not False:
        raise AdapterError("engine run ended in an error")
    text = report.get("result")
    if not isinstance(text, str):
        raise AdapterError("engine report has no final answer")
    return text


def _copilot_final_text(report_text: str) -> str:
    """The final message of Copilot's ``--output-format json`` event stream.

    One JSON object per line. The last line must be the ``result`` event
    with ``exitCode`` 0; the answer is the ``content`` of the last
    ``assistant.message`` event, which must request no tool (a run that
    ended on a tool request did not finish). The text output mode is not
    used: it renders the message as Markdown and so rewrites JSON strings
    (``*y*`` -> ``y``, measured).
    """
    events: list[dict[str, object]] = []
    for line in report_text.splitlines():
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            raise AdapterError("engine event stream holds a line that is not JSON") from None
        if not isinstance(event, dict):
            raise AdapterError("engine event stream holds a non-object")
        events.append(event)
    if not events or events[-1].get("type") != "result":
        raise AdapterError("engine event stream does not end in a result event")
    exit_code = events[-1].get("exitCode")
    if isinstance(exit_code, bool) or exit_code != 0:
        raise AdapterError("engine run ended in an error")
    messages = [e for e in events if e.get("type") == "assistant.message"]
    if not messages:
        raise AdapterError("engine event stream has no final answer")
    data = messages[-1].get("data")
    if not isinstance(data, dict) or data.get("toolRequests"):
        raise AdapterError("engine's last message is not a final answer")
    text = data.get("content")
    if not isinstance(text, str):
        raise AdapterError("engine event stream has no final answer")
    return text


_FINAL_TEXT = {"claude": _claude_final_text, "copilot": _copilot_final_text}


def extract_answer(engine_stdout: bytes, engine: str = "claude") -> bytes:
    """The one JSON value of ``engine``'s final answer, as UTF-8 bytes.

    ``engine_stdout`` is the engine's JSON output: Claude Code's report
    object (:func:`_claude_final_text`) or Copilot's event stream
    (:func:`_copilot_final_text`). The final message text, with surrounding
    whitespace and at most one enclosing Markdown code fence removed, must be
    exactly one JSON value; it is returned as sent (the broker validates and
    re-serializes it strictly).

    Raises:
        AdapterError: an engine this adapter does not drive; the output is
            not such a report, the run ended in an error, or the answer is
            not one JSON value or is larger than :data:`MAX_RESULT_BYTES`.
    """
    if engine not in ENGINES:
        raise AdapterError(f"unsupported engine {engine!r}")
    if len(engine_stdout) > MAX_ENGINE_STDOUT_BYTES:
        raise AdapterError("engine report too large")
    try:
        report_text = engine_stdout.decode("utf-8")
    except UnicodeDecodeError:
        raise AdapterError("engine report is not JSON") from None
    answer = _strip_fence(_FINAL_TEXT[engine](report_text).strip())
    try:
        json.loads(answer)
    except ValueError:
        raise AdapterError("final answer is not one JSON value") from None
    data = answer.encode("utf-8", "surrogatepass")
    if len(data) > MAX_RESULT_BYTES:
        raise AdapterError(f"final answer is larger than {MAX_RESULT_BYTES} bytes")
    return data


def engine_argv(engine: str, model: str, prompt: str) -> list[str]:
    """The engine's fixed non-interactive command line (ENGINES.md).

    Copilot: see :func:`_copilot_argv`. Claude Code 2.1.328: print mode
    with a JSON report, only the Bash and Read tools, permissions bypassed
    (the enclave is the sandbox), no session file, no settings from any scope but the command line's
    (``--setting-sources ""``: neither the user's HOME nor the repository's
    ``.claude/``), no MCP server but the empty command-line set
    (``--strict-mcp-config``), no slash commands (a seed's
    ``.claude/commands``). CLAUDE.md memory files are switched off by the
    environment (:func:`engine_env`).

    Raises:
        AdapterError: an engine this adapter does not drive, or a model name
            that could be read as an option.
    """
    if engine not in ENGINES:
        raise AdapterError(f"unsupported engine {engine!r}")
    if not model or model.startswith("-"):
        raise AdapterError(f"invalid model name {model!r}")
    if engine == "copilot":
        return _copilot_argv(model, prompt)
    return [
        ENGINE_BINARIES[engine],
        "-p",
        prompt,
        "--model",
        model,
        "--output-format",
        "json",
        "--tools",
        "Bash,Read",
        "--allowedTools",
        "Bash,Read",
        "--permission-mode",
        "bypassPermissions",
        "--no-session-persistence",
        "--setting-sources",
        "",
        "--strict-mcp-config",
        "--mcp-config",
        '{"mcpServers":{}}',
        "--disable-slash-commands",
    ]


def _copilot_argv(model: str, prompt: str) -> list[str]:
    """GitHub Copilot CLI 1.0.102 in prompt mode, BYOK (the model is :func:`engine_env`'s).

    The JSONL event stream (``--output-format json``) carries the final
    message verbatim; no streaming (the API proxy sees whole responses); no
    question to a user, no update, no remote control or export, no built-in
    MCP server (GitHub's), no telemetry; no custom instructions
    (``AGENTS.md``, ``.github/copilot-instructions.md`` and the like: a
    seed's would steer it) and the working directory is never trusted (no
    ``--trust-folder``, and ``COPILOT_ALLOW_ALL`` is not set), so a seed's
    skills, plugins, MCP servers and hooks are not loaded. Only
    :data:`COPILOT_TOOLS` are offered, all pre-approved (the enclave is the
    sandbox). ``model`` is checked by the caller and passed as
    ``COPILOT_MODEL`` (BYOK needs it there).
    """
    del model
    return [
        ENGINE_BINARIES["copilot"],
        "-p",
        prompt,
        "--output-format",
        "json",
        "--stream",
        "off",
        "--no-color",
        "--no-ask-user",
        "--no-auto-update",
        "--no-custom-instructions",
        "--no-remote",
        "--no-remote-export",
        "--disable-builtin-mcps",
        "--disable-client-telemetry",
        "--allow-all-tools",
        "--allow-all-paths",
        "--available-tools=" + ",".join(COPILOT_TOOLS),
    ]


#: Variables the engine gets from the adapter's own (fixed, trusted)
#: environment; nothing else is inherited.
_PASSED_ENV = ("PATH", "LANG", "HOME", "TMPDIR")
#: Per engine, its endpoint variables (``sandbox/enclave_spec.py``
#: ``ENGINE_ENDPOINT_ENV``: the proxy's URL and the invocation's
#: placeholder), passed through as well.
_ENDPOINT_ENV: Mapping[str, tuple[str, ...]] = {
    "claude": ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
    "copilot": ("COPILOT_PROVIDER_BASE_URL", "COPILOT_PROVIDER_API_KEY"),
}
#: Claude Code switches: no update check, no telemetry, error reporting or
#: other traffic beyond the model API; no CLAUDE.md memory files (the
#: seed's would steer it); no IDE or terminal integration; the shell stays
#: in the working directory.
_CLAUDE_ENV: Mapping[str, str] = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_DISABLE_CLAUDE_MDS": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "CLAUDE_CODE_IDE_SKIP_AUTO_INSTALL": "1",
    "CLAUDE_BASH_MAINTAIN_PROJECT_WORKING_DIR": "1",
    "IS_SANDBOX": "1",
}


#: Copilot switches (``copilot help environment``, ``help providers``):
#: offline BYOK against the OpenAI chat-completions wire (no GitHub sign-in,
#: telemetry, web tools or update check), the pre-unpacked package, no
#: indexed-search server, no OpenTelemetry.
_COPILOT_ENV: Mapping[str, str] = {
    "COPILOT_OFFLINE": "true",
    "COPILOT_PROVIDER_TYPE": "openai",
    "COPILOT_PROVIDER_WIRE_API": "completions",
    "COPILOT_AUTO_UPDATE": "false",
    "COPILOT_PKG_CACHE_HOME": COPILOT_PKG_CACHE,
    "COPILOT_OTEL_ENABLED": "false",
    "USE_TGREP": "false",
    "NO_COLOR": "1",
}


def engine_env(engine: str, environ: Mapping[str, str], model: str = "") -> dict[str, str]:
    """The engine's environment: the passed-through fixed variables plus the engine's switches.

    ``model`` is the configured model; copilot takes it from
    ``COPILOT_MODEL`` (claude from its command line).

    Raises:
        AdapterError: an engine this adapter does not drive, or copilot
            without a plain model name.
    """
    if engine not in ENGINES:
        raise AdapterError(f"unsupported engine {engine!r}")
    passed = (*_PASSED_ENV, *_ENDPOINT_ENV[engine])
    env = {name: environ[name] for name in passed if name in environ}
    if engine == "copilot":
        if not model or model.startswith("-"):
            raise AdapterError(f"invalid model name {model!r}")
        env.update(_COPILOT_ENV)
        env["COPILOT_MODEL"] = model
    else:
        env.update(_CLAUDE_ENV)
    return env


def _read_bounded(path: str, limit: int) -> bytes:
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise AdapterError(f"{path} is larger than {limit} bytes")
    return data


def bounded_output(chunks: Iterable[bytes], *, tail: bool) -> bytes:
    """At most :data:`MAX_ENGINE_STDOUT_BYTES` of ``chunks``, plus one chunk's slack.

    Head (``tail`` false): the first bytes; a longer report comes out longer
    than the bound, which :func:`extract_answer` refuses. Tail: the last
    bytes, and when anything was dropped, only from the first whole line on
    (a cut line is not an event).
    """
    kept = bytearray()
    dropped = False
    for chunk in chunks:
        if not tail:
            if len(kept) <= MAX_ENGINE_STDOUT_BYTES:
                kept += chunk
            continue
        kept += chunk
        excess = len(kept) - MAX_ENGINE_STDOUT_BYTES
        if excess > 0:
            del kept[:excess]
            dropped = True
    if dropped:
        newline = kept.find(b"\n")
        del kept[: newline + 1 if newline >= 0 else len(kept)]
    return bytes(kept)


def _run_engine(argv: Sequence[str], env: Mapping[str, str], *, tail: bool) -> bytes:
    """Run the engine to completion; its stdout, bounded (:func:`bounded_output`)."""
    with subprocess.Popen(
        list(argv),
        cwd=SEED_DIR,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=None,
    ) as proc:
        assert proc.stdout is not None
        stdout = proc.stdout
        output = bounded_output(iter(lambda: stdout.read(65536), b""), tail=tail)
        proc.wait()
    return output


def _write_result(data: bytes) -> None:
    """Write ``data`` into the pre-created result file (a bind mount: never replaced)."""
    fd = os.open(RESULT_PATH, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def main(argv: Sequence[str]) -> int:
    """``adapter.py ENGINE MODEL``: 0 when an answer was written, 1 otherwise.

    Failures name their reason on stderr (discarded by the broker; kept by
    the tests) and leave the result file empty.
    """
    if len(argv) != 2:
        print("usage: adapter.py ENGINE MODEL", file=sys.stderr)
        return 2
    engine, model = argv
    try:
        task = _read_bounded(TASK_PATH, MAX_TASK_BYTES).decode("utf-8")
        schema = _read_bounded(SCHEMA_PATH, MAX_SCHEMA_BYTES).decode("utf-8")
        prompt = build_prompt(task, schema)
        command = engine_argv(engine, model, prompt)
        env = engine_env(engine, os.environ, model)
        home = env.get("HOME")
        if home:
            os.makedirs(home, mode=0o700, exist_ok=True)
        output = _run_engine(command, env, tail=engine in _STREAMING_OUTPUT)
        answer = extract_answer(output, engine)
    except (AdapterError, UnicodeDecodeError, OSError) as exc:
        print(f"adapter: no answer: {exc}", file=sys.stderr)
        return 1
    _write_result(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
