#!/usr/bin/env python3
"""The demo agent: it learns how to ask from SKILL.md, exactly as an agent would.

It runs under ``bounded-query-harness run`` (or ``demo``), so it finds
``bounded-query`` and ``bounded-query-cost`` first on PATH, the skill at
``$AWF_BOUNDED_QUERY_SKILL`` and the repositories in
``$AWF_BOUNDED_QUERY_REPOS``. It runs every copyable example of the skill
(one per schema kind) verbatim through ``sh``, then two questions of its own:
one that no longer fits the budget (the broker refuses it) and one that still
does, then one against the sealed repository. Before each question it asks
the local, free cost tool for the exact charge and keeps its own ledger, as
the skill tells it to, so the output shows the budget draining.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable

REPO = "example/widgets"
SEALED = "example/vault"
BUDGET = 64

#: One skill example: "### kind: question", prose, then a ```sh block holding
#: ``bounded-query --repo R --schema 'S' <<'EOF' ... EOF``.
EXAMPLE_RE = re.compile(
    r"^### (?P<kind>\w+): (?P<question>.+?)\n.*?^```sh\n"
    r"(?P<block>bounded-query --repo \S+ --schema '(?P<schema>[^']+)' <<'EOF'\n.*?^EOF)\n```",
    re.MULTILINE | re.DOTALL,
)
#: The agent's own questions after the skill's examples: (kind, question, schema, script).
OWN_QUESTIONS: list[tuple[str, str, object, str]] = [
    (
        "integer",
        "How many lines of Python are there (0-1000)? (does not fit any more)",
        {"type": "integer", "minimum": 0, "maximum": 1000},
        "import json, pathlib\n"
        "n = sum(len(p.read_text().splitlines())\n"
        "        for p in pathlib.Path('/query/repo').rglob('*.py'))\n"
        "json.dump(min(n, 1000), open('/query/out', 'w'))\n",
    ),
    (
        "boolean",
        "Does src/widgets/core.py define assemble()? (still fits)",
        {"type": "boolean"},
        "import json\n"
        "text = open('/query/repo/src/widgets/core.py').read()\n"
        "json.dump('def assemble' in text, open('/query/out', 'w'))\n",
    ),
]


def cost(schema: str) -> int:
    """The exact charge, from the local cost tool (free, no broker involved)."""
    done = subprocess.run(
        ["bounded-query-cost", "--json", "--schema", schema],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(json.loads(done.stdout)["chargeBits"])


def ask(repo: str, schema: str, script: str) -> str:
    """Ask one question through the wrapper; return its single output line."""
    done = subprocess.run(
        ["bounded-query", "--repo", repo, "--schema", schema],
        input=script.encode(),
        capture_output=True,
        check=True,
    )
    return done.stdout.decode().strip()


def run_block(block: str) -> str:
    """Run a copyable skill example verbatim; return its single output line."""
    done = subprocess.run(["sh", "-c", block], capture_output=True, check=True)
    return done.stdout.decode().strip()


def skill_examples() -> list[tuple[str, str, str, str]]:
    """(kind, question, schema, shell block) of every example, aimed at REPO."""
    with open(os.environ["AWF_BOUNDED_QUERY_SKILL"], encoding="utf-8") as handle:
        text = handle.read()
    return [
        (m["kind"], m["question"], m["schema"], re.sub(r"--repo \S+", f"--repo {REPO}", m["block"]))
        for m in EXAMPLE_RE.finditer(text)
    ]


def main() -> int:
    """Ask every question and print the ledger as it drains."""
    print(f"repositories: {os.environ.get('AWF_BOUNDED_QUERY_REPOS', '')}")
    print(f"skill: {os.environ.get('AWF_BOUNDED_QUERY_SKILL')}")
    print(f"{REPO} is internal: {BUDGET} bits for the whole run\n")
    questions: list[tuple[str, str, str, Callable[[], str]]] = [
        (kind, question, schema, functools.partial(run_block, block))
        for kind, question, schema, block in skill_examples()
    ]
    for kind, question, schema_obj, body in OWN_QUESTIONS:
        schema = json.dumps(schema_obj)
        questions.append((kind, question, schema, functools.partial(ask, REPO, schema, body)))
    remaining = BUDGET
    header = f"{'kind':8} {'charge':>6} {'left':>5}  question -> answer"
    print(header)
    print("-" * len(header))
    for kind, question, schema, asker in questions:
        charge = cost(schema)
        fits = charge <= remaining
        answer = asker()
        if fits:
            remaining -= charge
        note = "" if fits else f"   <- refused: {charge} bits > {remaining} left"
        print(f"{kind:8} {charge:>6} {remaining:>5}  {question}\n{'':22}-> {answer}{note}")
    sealed = ask(SEALED, '{"type":"boolean"}', "open('/query/out', 'w').write('true')\n")
    print(f"\n{SEALED} is sealed (0 bits): a boolean question -> {sealed}")
    if os.environ.get("AWF_BOUNDED_AGENT_SOCKET"):
        ask_agent()
    return 0


#: The bounded-agent question: a task for a coding agent instead of a script.
AGENT_TASK = "Is this library at a 2.x release or later? Its version is in the VERSION file."


def ask_agent() -> None:
    """One bounded-agent question (spec 15), its own budget, the same envelope."""
    skill = os.environ.get("AWF_BOUNDED_AGENT_SKILL", "")
    print(f"\nbounded agents: skill {skill}; {REPO} has its own {BUDGET}-bit budget there")
    done = subprocess.run(
        ["bounded-agent", "--repo", REPO, "--schema", '{"type":"boolean"}'],
        input=AGENT_TASK.encode(),
        capture_output=True,
        check=True,
    )
    charge = cost('{"type":"boolean"}')
    print(f"agent    {charge:>6}        {AGENT_TASK}\n{'':22}-> {done.stdout.decode().strip()}")


if __name__ == "__main__":
    sys.exit(main())
