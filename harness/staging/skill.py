"""The generated SKILL.md (spec 14.8).

Pure: :func:`render_skill` takes the normalized configuration and returns the
Markdown text. Every number in the worked charge table and in the examples is
computed with the broker's own protocol module (``parse_schema``,
``cardinality``, ``charge``), never written by hand, so the skill cannot
drift from what the broker debits. The skill names repositories, their
sensitivity and run budget -- the agent may know those -- but no path of the
private root. The one exception to "pure" is :func:`write_agent_ingress`,
the run lifecycle's hook for the agent ingress, which delegates to
``outputs.write_agent_ingress_files``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from bounded_query.broker import protocol
from bounded_query.broker.protocol import policy
from bounded_query.broker.timing import bucket_label
from bounded_query.harness.configuration.config import (
    BoundedAgentsConfig,
    BoundedQueriesConfig,
    PrivateRepo,
)
from bounded_query.harness.lifecycle.paths import RunPaths

__all__ = [
    "AGENT_EXAMPLES",
    "EXAMPLES",
    "AgentExample",
    "Example",
    "charge_of",
    "render_agent_skill",
    "render_skill",
    "write_agent_ingress",
]


@dataclass(frozen=True, slots=True)
class Example:
    """A copyable question for one schema kind."""

    kind: str
    question: str
    schema: object
    script: str


EXAMPLES: tuple[Example, ...] = (
    Example(
        "const",
        "Does the script run at all? (the answer is fixed; only ok/error and timing tell)",
        {"type": "const", "value": "done"},
        'import json\njson.dump("done", open("/query/out", "w"))\n',
    ),
    Example(
        "boolean",
        "Is there a README at the top level?",
        {"type": "boolean"},
        "import json, os\n"
        'json.dump(os.path.exists("/query/repo/README.md"), open("/query/out", "w"))\n',
    ),
    Example(
        "enum",
        "Which build system does the repository use?",
        {"type": "enum", "values": ["make", "pyproject", "npm", "other"]},
        "import json, os\n"
        'r = "/query/repo"\n'
        'kind = ("make" if os.path.exists(f"{r}/Makefile") else\n'
        '        "pyproject" if os.path.exists(f"{r}/pyproject.toml") else\n'
        '        "npm" if os.path.exists(f"{r}/package.json") else "other")\n'
        'json.dump(kind, open("/query/out", "w"))\n',
    ),
    Example(
        "integer",
        "How many Python files are there (capped at 1000)?",
        {"type": "integer", "minimum": 0, "maximum": 1000},
        "import json, pathlib\n"
        'n = sum(1 for _ in pathlib.Path("/query/repo").rglob("*.py"))\n'
        'json.dump(min(n, 1000), open("/query/out", "w"))\n',
    ),
    Example(
        "object",
        "Does it have tests, and roughly how many commits (bucketed)?",
        {
            "type": "object",
            "fields": {
                "hasTests": {"type": "boolean"},
                "commits": {"type": "enum", "values": ["<10", "<100", "<1000", "more"]},
            },
        },
        "import json, os, subprocess\n"
        'r = "/query/repo"\n'
        'n = int(subprocess.run(["git", "-C", r, "rev-list", "--count", "HEAD"],\n'
        "                       capture_output=True, text=True).stdout or 0)\n"
        'b = "<10" if n < 10 else "<100" if n < 100 else "<1000" if n < 1000 else "more"\n'
        'json.dump({"hasTests": os.path.isdir(f"{r}/tests"), "commits": b},\n'
        '          open("/query/out", "w"))\n',
    ),
    Example(
        "tuple",
        "Are there a LICENSE and a CHANGELOG?",
        {"type": "tuple", "items": [{"type": "boolean"}, {"type": "boolean"}]},
        "import json, os\n"
        'r = "/query/repo"\n'
        'json.dump([os.path.exists(f"{r}/LICENSE"), os.path.exists(f"{r}/CHANGELOG.md")],\n'
        '          open("/query/out", "w"))\n',
    ),
    Example(
        "array",
        "For 4 named files, does each exist?",
        {"type": "array", "items": {"type": "boolean"}, "length": 4},
        "import json, os\n"
        'names = ["setup.py", "src", "tests", "docs"]\n'
        'json.dump([os.path.exists(f"/query/repo/{n}") for n in names],\n'
        '          open("/query/out", "w"))\n',
    ),
    Example(
        "union",
        "Is there a version file, and if so which major version (0-15)?",
        {
            "type": "union",
            "variants": {
                "none": {"type": "const", "value": None},
                "major": {"type": "integer", "minimum": 0, "maximum": 15},
            },
        },
        "import json, re\n"
        "try:\n"
        '    text = open("/query/repo/VERSION").read()\n'
        '    m = int(re.match(r"\\s*(\\d+)", text).group(1))\n'
        '    answer = {"tag": "major", "value": min(m, 15)}\n'
        "except Exception:\n"
        '    answer = {"tag": "none", "value": None}\n'
        'json.dump(answer, open("/query/out", "w"))\n',
    ),
)


def charge_of(schema_obj: object) -> tuple[int, int]:
    """(cardinality, charge) of a schema, computed by the protocol module."""
    schema = protocol.parse_schema(schema_obj)
    return int(protocol.cardinality(schema)), int(protocol.charge(schema))


def _compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _budget_text(bits: int | None, sensitivity: str) -> str:
    if bits is None:
        return f"unmetered (`{sensitivity}`)"
    return f"{bits} bits/run (`{sensitivity}`)"


def _capacity_text(bits: int | None) -> str:
    """What a run budget buys, from the protocol's own charges."""
    if bits is None:
        return "no bit budget (never refused for bits); only the request limit applies"
    floor = charge_of({"type": "const", "value": 0})[1]
    if bits < floor:
        return "cannot fund any question: every request is refused"
    yes_no = charge_of({"type": "boolean"})[1]
    overhead = protocol.RESULT_STATUS_BIT_COST + protocol.TIMING_BUCKET_BITS
    largest = bits - overhead
    return (
        f"room for {bits // yes_no} yes/no question{'s' if bits // yes_no != 1 else ''},"
        " or a single answer with up to"
        f" {2**largest if largest <= 20 else f'2^{largest}'} possible values"
    )


def _repo_section(repos: Sequence[PrivateRepo], note: str = "") -> list[str]:
    lines = [
        "## Repositories",
        "",
        "Each repository has its own budget for this whole run (it never refills)." + note,
        "",
    ]
    for repo in repos:
        lines.append(
            f"- `{repo.repo}` — {_budget_text(repo.budget, repo.sensitivity)}:"
            f" {_capacity_text(repo.budget)}"
        )
    return [*lines, ""]


def _charge_table(examples: Sequence[Example | AgentExample]) -> list[str]:
    status = protocol.RESULT_STATUS_BIT_COST
    timing = protocol.TIMING_BUCKET_BITS
    internal = protocol.policy.METERED_BUDGETS["internal"]
    confidential = protocol.policy.METERED_BUDGETS["confidential"]
    lines = [
        "| schema | cardinality | charge (bits) = status + schema + timing"
        f" | how many fit in {internal} bits (`internal`)"
        f" | in {confidential} bits (`confidential`) |",
        "|---|---:|---:|---:|---:|",
    ]
    for example in examples:
        card, bits = charge_of(example.schema)
        lines.append(
            f"| `{_compact(example.schema)}` | {card} | {status} + {bits - status - timing}"
            f" + {timing} = **{bits}** | {internal // bits} | {confidential // bits} |"
        )
    return lines


def _cost_tool_sample() -> list[str]:
    """The cost tool's real output for the boolean example (same code, same numbers)."""
    from bounded_query.wrapper import bounded_query_cost as cost_tool

    schema = _compact({"type": "boolean"})
    report = cost_tool.render(cost_tool.assess(schema.encode(), protocol), protocol, False)
    return [f"$ bounded-query-cost --schema '{schema}'", *report.rstrip("\n").splitlines()]


def _examples(
    command: str, first_repo: str, examples: Sequence[Example | AgentExample]
) -> list[str]:
    """One copyable block per example: ``command`` with the schema, the body
    (the script or the task) as a here-document, and the example's charge."""
    lines: list[str] = []
    for example in examples:
        card, bits = charge_of(example.schema)
        body = example.script if isinstance(example, Example) else example.task
        lines += [
            f"### {example.kind}: {example.question}",
            "",
            f"Cardinality {card}, charge {bits} bits.",
            "",
            "```sh",
            f"{command} --repo {first_repo} --schema '{_compact(example.schema)}' <<'EOF'",
            body.rstrip("\n"),
            "EOF",
            "```",
            "",
        ]
    return lines


def _cost_section(
    subject: str, overrun: str, examples: Sequence[Example | AgentExample]
) -> list[str]:
    """The charge formula, the buckets and the worked charge table (both skills).

    ``subject`` names what the bucket measures ("query"); ``overrun`` ends the
    paragraph (what happens past the timeout).
    """
    buckets = ", ".join(bucket_label(ms) for ms in protocol.TIMING_BUCKETS_MS)
    status = protocol.RESULT_STATUS_BIT_COST
    timing = protocol.TIMING_BUCKET_BITS
    floor = charge_of({"type": "const", "value": 0})[1]
    return [
        "## What a question costs",
        "",
        f"charge = {status} (ok/error) + ceil(log2(cardinality)) + {timing} (timing bucket)",
        "",
        f"The cheapest question (a `const`) costs {floor} bits. An answer is released only",
        f"at the first of the fixed timing buckets ({buckets}) that the",
        f"{subject} (start to cleanup) fits in, so its duration reveals no more than the",
        f"{timing} timing bits already charged; {overrun}",
        "",
        *_charge_table(examples),
        "",
        "## Sizing a question to the budget",
        "",
        "Nothing tells you your remaining budget, and a refusal looks like any other",
        "error: keep your own ledger (budget minus the charge of every request that",
    ]


def _schema_language(writer: str, limit: str) -> list[str]:
    """The schema DSL table and its bounds (one text for both skills).

    ``writer`` heads the answer column ("the script writes"); ``limit`` ends
    the bounds sentence (the request body's own limit).
    """
    return [
        "## The schema language",
        "",
        f"| type | schema | {writer} | cardinality |",
        "|---|---|---|---|",
        '| const | `{"type":"const","value":L}` | exactly `L` | 1 |',
        '| boolean | `{"type":"boolean"}` | `true` or `false` | 2 |',
        '| enum | `{"type":"enum","values":[L,...]}` (distinct, one JSON type)'
        " | one of the values | number of values |",
        '| integer | `{"type":"integer","minimum":N,"maximum":M}` | an integer N..M | M - N + 1 |',
        '| object | `{"type":"object","fields":{"k":S,...}}` (at least one field)'
        " | an object with every field | product |",
        '| tuple | `{"type":"tuple","items":[S,...]}` (at least one item)'
        " | a list, one value per item | product |",
        '| array | `{"type":"array","items":S,"length":N}` | a list of exactly N values'
        " | card(S)^N |",
        '| union | `{"type":"union","variants":{"t":S,...}}` | `{"tag":"t","value":<S>}` | sum |',
        "",
        "`S` is any schema (nesting is allowed). An empty object, tuple, enum or union is",
        "an invalid schema (a fixed answer is a `const`). A value that does not match the",
        "schema exactly (a missing field, an extra key, `1.0` for an integer, a value out",
        "of range) is an error -- and is still charged.",
        "",
        "A literal `L` is a string of at most "
        f"{protocol.MAX_LITERAL_STRING_BYTES} UTF-8 bytes, a safe integer, a boolean or null.",
        'A union value is `{"tag":"<name>","value":<value>}`. Integers are plain integer',
        "tokens (`1`; `-0` is `0`; never `1.0`, `1e0` or `-0.0`). Bounds: depth"
        f" {protocol.MAX_SCHEMA_DEPTH} (the top-level schema is depth 0, so at most"
        f" {protocol.MAX_SCHEMA_DEPTH} containers nest around a leaf),"
        f" {protocol.MAX_SCHEMA_NODES} nodes,"
        f" {protocol.MAX_SCHEMA_BYTES} bytes, {protocol.MAX_ENUM_VALUES} enum values,"
        f" {protocol.MAX_OBJECT_FIELDS} object fields, {protocol.MAX_TUPLE_ITEMS} tuple items,"
        f" array length {protocol.MAX_ARRAY_LENGTH}, {protocol.MAX_UNION_VARIANTS} union"
        f" variants; {limit}.",
        "",
    ]


def _mcp_section() -> list[str]:
    """The MCP server and each client's configuration (``mcp_config.py``, one source)."""
    lines = [
        "## From an MCP client",
        "",
        "`bounded-query-mcp` (next to `bounded-query` on PATH) is a stdio MCP server with the",
        "tools `bounded_query({repo, schema, script})` and `bounded_query_cost({schema})`:",
        "the same answers, charges and limits as the two commands (the schema is JSON",
        'text; the structured result is exactly `{"status":"ok","result":...}` or',
        '`{"status":"error"}`). This file is its resource `bounded-query://SKILL.md`.',
        "Register it with your client (it forwards the three `AWF_BOUNDED_QUERY_*`",
        "variables from the client's environment):",
        "",
    ]
    return [*lines, *_mcp_snippets()]


def _mcp_snippets(
    server_name: str | None = None, variables: Sequence[str] = policy.AGENT_VARIABLES
) -> list[str]:
    """Each client's registration of ``bounded-query-mcp`` (``mcp_config.py``):
    under ``server_name`` (default: the query subsystem's), forwarding ``variables``."""
    from bounded_query.harness.staging.mcp_config import (
        CONFIG_FILES,
        SERVER_NAME,
        render_mcp_config,
    )

    name = server_name or SERVER_NAME
    lines: list[str] = []
    for client, where in CONFIG_FILES.items():
        language = "toml" if client == "codex" else "json"
        snippet = render_mcp_config(client, server_name=name, variables=variables)
        lines += [
            f"- {client}: {where.replace(f' {SERVER_NAME} ', f' {name} ')}",
            "",
            f"```{language}",
            *snippet.rstrip("\n").splitlines(),
            "```",
            "",
        ]
    return lines


def render_skill(config: BoundedQueriesConfig) -> str:
    """The SKILL.md text for ``config`` (spec 14.8)."""
    usable = [r.repo for r in config.private_repos if r.sensitivity != policy.SENSITIVITY_SEALED]
    first = usable[0] if usable else "owner/repo"
    lines = [
        "---",
        "name: bounded-queries",
        "description: Ask bounded, bit-charged questions about private repositories you cannot"
        " read, through the `bounded-query` command.",
        "---",
        "",
        "# Bounded queries",
        "",
        "You cannot read the repositories below. You can send a short Python 3 script",
        "that runs against a private, writable copy of one of them and get back only a",
        "value of a *finite* response schema that you declare. Every answer costs bits",
        "from that repository's run budget, charged before the script runs and never",
        "refunded, whatever the outcome.",
        "",
        *_repo_section(config.private_repos),
        f"Operational limit: at most **{config.max_invocations}** requests per run, over all",
        "repositories, counting refused ones. Each script may run for at most",
        f"{config.timeout} s with {config.memory_limit} of memory, has no network, and only",
        "the standard library plus `git` (read the history with `git -C /query/repo ...`).",
        "",
        "## How to ask",
        "",
        "```sh",
        f"bounded-query --repo {first} --schema '<schema JSON>' < script.py",
        "```",
        "",
        "The script runs with the repository checked out at `/query/repo` (cwd `/query`)",
        "and must write its answer as JSON to `/query/out`. The command prints exactly",
        'one line: `{"status":"ok","result":<value>}` or `{"status":"error"}`. An error',
        "says nothing about why (bad schema, budget exhausted, crash, timeout, wrong",
        "output all look the same). Once a request is accepted its charge is spent,",
        "whether the script answers, crashes or times out.",
        "Stdout and stderr of the script are discarded.",
        "",
        *_schema_language(
            "the script writes",
            f"scripts up to {protocol.MAX_SCRIPT_BYTES // 1024} KiB",
        ),
        *_cost_section(
            "query",
            "a script that runs past the timeout is an\n"
            "error. Worked examples (computed by the broker's own code):",
            EXAMPLES,
        ),
        "was not refused) and only ask what still fits.",
        "",
        "- Check a schema before spending anything with `bounded-query-cost` (local and",
        "  free; exit status 0 valid, 1 invalid; `--json` for one JSON object):",
        "",
        "```console",
        *_cost_tool_sample(),
        "```",
        "",
        "- Ask for the smallest answer that decides your next step: a boolean or a",
        "  small enum instead of a count; bucket counts into a few ranges; cap",
        "  integers (`min(n, 1000)`) and keep the range tight.",
        "- Several facts in one object or tuple cost ceil(log2(product of their",
        "  cardinalities)) -- never more than the sum of their bits -- and pay the",
        "  status and timing bits only once: batch related questions.",
        "- Make the script robust (catch exceptions and map them to a value of the",
        "  schema): a crash is an error that still costs the full charge.",
        "- A refused request (over budget) costs no bits but counts toward the",
        "  request limit.",
        "",
        *_mcp_section(),
        "## Examples (one per schema kind)",
        "",
        *_examples("bounded-query", first, EXAMPLES),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


# --- 15.8 the bounded-agent skill ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentExample:
    """A copyable bounded-agent question: a task and its schema."""

    kind: str
    question: str
    schema: object
    task: str


AGENT_EXAMPLES: tuple[AgentExample, ...] = (
    AgentExample(
        "boolean",
        "Does the retry loop give up after a timeout?",
        {"type": "boolean"},
        "Read the network code (look for the retry loop around outgoing requests).\n"
        "Answer true if the loop stops retrying once a timeout or deadline passes,\n"
        "false if it retries without any time limit. If there is no retry loop,\n"
        "answer false.\n",
    ),
    AgentExample(
        "enum",
        "Which module owns session expiry?",
        {"type": "enum", "values": ["auth", "session", "middleware", "none", "unsure"]},
        "Find the code that decides when a user session expires. Answer with the\n"
        'top-level module that owns that decision: "auth", "session" or "middleware";\n'
        '"none" if sessions never expire; "unsure" if you cannot tell.\n',
    ),
    AgentExample(
        "integer",
        "How many public HTTP endpoints are there (capped at 63)?",
        {"type": "integer", "minimum": 0, "maximum": 63},
        "Count the HTTP endpoints the server registers that need no authentication.\n"
        "Answer the count as an integer, or 63 if there are 63 or more.\n",
    ),
    AgentExample(
        "object",
        "Is input validated, and how risky is the upload handler?",
        {
            "type": "object",
            "fields": {
                "validated": {"type": "boolean"},
                "risk": {"type": "enum", "values": ["low", "medium", "high"]},
            },
        },
        "Review the file-upload handler. validated: true if every field of the\n"
        "request is checked before use. risk: your judgment of how exploitable the\n"
        'handler is, "low", "medium" or "high".\n',
    ),
    AgentExample(
        "union",
        "Is there a hard-coded credential, and if so of which kind?",
        {
            "type": "union",
            "variants": {
                "none": {"type": "const", "value": None},
                "found": {"type": "enum", "values": ["password", "api-key", "private-key"]},
            },
        },
        "Search the repository for credentials written into the source or the\n"
        'configuration. If there is none, answer {"tag":"none","value":null};\n'
        'otherwise {"tag":"found","value":K} with K the kind of the first one:\n'
        '"password", "api-key" or "private-key".\n',
    ),
)


def _agent_mcp_section() -> list[str]:
    """The MCP tool and its registration with the bounded-agent variables."""
    from bounded_query.harness.staging.mcp_config import AGENT_SERVER_NAME

    lines = [
        "## From an MCP client",
        "",
        "`bounded-query-mcp` (next to `bounded-agent` on PATH) lists the tool",
        "`bounded_agent({repo, schema, task})` whenever `AWF_BOUNDED_AGENT_SOCKET` is set:",
        "the same answers, charges and limits as the command (the schema is a JSON",
        "object, sent as compact UTF-8 JSON, or JSON text; the structured result is exactly",
        '`{"status":"ok","result":...}` or `{"status":"error"}`);',
        "`bounded_query_cost({schema})` prices a schema. This file is its resource",
        "`bounded-agent://SKILL.md`. Register it with your client (it forwards the three",
        "`AWF_BOUNDED_AGENT_*` variables from the client's environment):",
        "",
    ]
    return [*lines, *_mcp_snippets(AGENT_SERVER_NAME, policy.AGENT_SUBSYSTEM_VARIABLES)]


def render_agent_skill(config: BoundedAgentsConfig) -> str:
    """The bounded-agent SKILL.md text for ``config`` (spec 15.8, 15.9).

    Like :func:`render_skill`: every charge is computed by the broker's
    protocol module and every limit is the configuration's, so the skill
    cannot drift from what the agent broker enforces.
    """
    usable = [r.repo for r in config.private_repos if r.sensitivity != policy.SENSITIVITY_SEALED]
    first = usable[0] if usable else "owner/repo"
    lines = [
        "---",
        "name: bounded-agent",
        "description: Ask a coding agent a bounded, bit-charged question about a private"
        " repository you cannot read, through the `bounded-agent` command; the answer is"
        " one value of a finite schema you declare.",
        "---",
        "",
        "# Bounded agents",
        "",
        "You cannot read the repositories below. You can give a task in plain language",
        f"to a coding agent (the `{config.engine}` engine, model `{config.model}`) that reads",
        "a read-only copy of one of them in a fresh, single-use sandbox and must reduce",
        "its work to one value of a *finite* response schema that you declare. You get",
        "back only that value. Every answer costs bits from that repository's run",
        "budget, charged before the agent starts and never refunded, whatever the",
        "outcome.",
        "",
        "## Before you ask: the provider sees the code",
        "",
        "The agent works by sending repository content (file listings, excerpts, search",
        f"hits it chooses) to the model provider of the `{config.engine}` engine (model",
        f"`{config.model}`).",
        "The bit budget bounds what *you* learn, not what the provider sees: the",
        "operator has accepted the provider as a recipient of this code. A bounded",
        "query (`bounded-query`, when it is available) has no network at all.",
        "",
        "**Prefer a bounded query** whenever a deterministic script can answer (does a",
        "file exist, how many tests, which build system, does a string occur): it",
        "sends nothing to any provider, costs the same bits for the same schema, and",
        "usually answers in a shorter timing bucket. Use a bounded agent for questions",
        'that need judgment or multi-step reading ("does the retry loop give up after',
        'a timeout?", "which module owns session expiry?").',
        "",
        *_repo_section(
            config.private_repos,
            " It is this subsystem's own: bounded queries draw on a separate budget.",
        ),
        f"Operational limits: at most **{config.max_invocations}** requests per run, over all",
        "repositories, counting refused ones. A task is at most",
        f"{config.max_task_bytes} bytes of UTF-8 text. Each agent run may take at most",
        f"{config.timeout} s and at most {config.max_model_requests} model requests; its",
        f"answer is at most {config.max_output_bytes} bytes of JSON.",
        "",
        "## How to ask",
        "",
        "```sh",
        f"bounded-agent --repo {first} --schema '<schema JSON>' < task.txt",
        "```",
        "",
        "The task text (stdin) is given to the agent verbatim, together with your",
        "schema, and the repository is read-only at its working directory; it can run",
        "shell commands and read files, nothing else (no network but its model, no",
        "configuration from the repository). It must end with one JSON value of the",
        "schema. The command prints exactly one line:",
        '`{"status":"ok","result":<value>}` or `{"status":"error"}`. An error says',
        "nothing about why (bad schema, budget exhausted, timeout, an answer that does",
        "not match the schema all look the same). Once a request is accepted its",
        "charge is spent, whatever the agent does. The agent's transcript is never",
        "kept or shown to anyone.",
        "",
        "The task is text, never configuration: it cannot add a tool, change the model",
        "or any limit, or reach anything. Write it so the agent cannot miss the schema:",
        "say exactly which value means what, and which value to give when it cannot",
        'tell (an `"unsure"` enum value costs little and beats an error).',
        "",
        *_schema_language(
            "the agent answers",
            f"tasks up to {config.max_task_bytes} bytes",
        ),
        *_cost_section(
            "request",
            "an agent run takes seconds to minutes, and\n"
            f"one that runs past {config.timeout} s is an error. Worked examples (computed by\n"
            "the broker's own code):",
            AGENT_EXAMPLES,
        ),
        "was not refused) and only ask what still fits. Check a schema before",
        "spending anything with `bounded-query-cost --schema '<schema JSON>'` (local",
        "and free; the charge is the same for both subsystems).",
        "",
        "- Ask for the smallest answer that decides your next step: a boolean or a",
        "  small enum instead of a count; bucket counts; cap integers.",
        "- Batch related judgments into one object or tuple: the status and timing",
        "  bits are paid once.",
        "- A task, a schema or a repository refused by the command itself (an empty or",
        f"  oversize task, over {config.max_task_bytes} bytes) never reaches the broker and",
        "  costs nothing; a refusal by the broker (over budget) costs no bits but",
        "  counts toward the request limit.",
        "",
        *_agent_mcp_section(),
        "## Examples",
        "",
        *_examples("bounded-agent", first, AGENT_EXAMPLES),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


def write_agent_ingress(paths: RunPaths, config: BoundedAgentsConfig) -> None:
    """The lifecycle's hook (``orchestrate.write_agent_ingress_artifacts``): write
    the ``bounded-agent`` wrapper directory and this SKILL.md into the created
    agent ingress root, before the caller seals ``skill/``. I/O lives in
    ``outputs.py``; this only names it where the hook looks."""
    from bounded_query.harness.staging.outputs import write_agent_ingress_files

    write_agent_ingress_files(paths, config)
