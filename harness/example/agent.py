#!/usr/bin/env python3
"""The demo agent: one bounded question per schema kind, then an over-budget one.

It runs under ``bounded-query-harness run`` (or ``demo``), so it finds
``bounded-query`` and ``bounded-query-cost`` first on PATH and the repository
list in ``AWF_BOUNDED_QUERY_REPOS``. Before each question it asks the local,
free cost tool for the exact charge, and it keeps its own ledger of the
repository's remaining bits (internal: 64 per run), so the output shows the
budget draining and the broker refusing a question that no longer fits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = "example/widgets"
SEALED = "example/vault"
BUDGET = 64

OUT = "json.dump(answer, open('/query/out', 'w'))\n"
QUESTIONS: list[tuple[str, str, object, str]] = [
    (
        "const",
        "Does a trivial script run at all?",
        {"type": "const", "value": "done"},
        "answer = 'done'\n",
    ),
    (
        "boolean",
        "Does the repository have a tests/ directory?",
        {"type": "boolean"},
        "answer = os.path.isdir('/query/repo/tests')\n",
    ),
    (
        "enum",
        "Which build system does it use?",
        {"type": "enum", "values": ["make", "pyproject", "npm", "other"]},
        "r = '/query/repo'\n"
        "answer = ('make' if os.path.exists(r + '/Makefile') else 'pyproject'\n"
        "          if os.path.exists(r + '/pyproject.toml') else 'npm'\n"
        "          if os.path.exists(r + '/package.json') else 'other')\n",
    ),
    (
        "integer",
        "How many Python files does it contain (0-63)?",
        {"type": "integer", "minimum": 0, "maximum": 63},
        "import pathlib\n"
        "answer = min(63, sum(1 for _ in pathlib.Path('/query/repo').rglob('*.py')))\n",
    ),
    (
        "object",
        "Is there a LICENSE, and roughly how many commits?",
        {
            "type": "object",
            "fields": {
                "license": {"type": "boolean"},
                "commits": {"type": "enum", "values": ["1", "2-9", "10-99", "100+"]},
            },
        },
        "import subprocess\n"
        "n = int(subprocess.run(['git', '-C', '/query/repo', 'rev-list', '--count', 'HEAD'],\n"
        "                       capture_output=True, text=True).stdout)\n"
        "answer = {'license': os.path.exists('/query/repo/LICENSE'),\n"
        "          'commits': '1' if n == 1 else '2-9' if n < 10 else '10-99' if n < 100\n"
        "          else '100+'}\n",
    ),
    (
        "tuple",
        "Is there a README.md, and a CHANGELOG.md?",
        {"type": "tuple", "items": [{"type": "boolean"}, {"type": "boolean"}]},
        "answer = [os.path.exists('/query/repo/README.md'),\n"
        "          os.path.exists('/query/repo/CHANGELOG.md')]\n",
    ),
    (
        "array",
        "Which of these four paths exist: setup.py, src, docs, .github?",
        {"type": "array", "items": {"type": "boolean"}, "length": 4},
        "answer = [os.path.exists('/query/repo/' + p)\n"
        "          for p in ('setup.py', 'src', 'docs', '.github')]\n",
    ),
    (
        "union",
        "Is there a VERSION file, and if so its major version (0-15)?",
        {
            "type": "union",
            "variants": {
                "none": {"type": "const", "value": None},
                "major": {"type": "integer", "minimum": 0, "maximum": 15},
            },
        },
        "try:\n"
        "    major = int(open('/query/repo/VERSION').read().split('.')[0])\n"
        "    answer = {'tag': 'major', 'value': min(major, 15)}\n"
        "except (OSError, ValueError):\n"
        "    answer = {'tag': 'none', 'value': None}\n",
    ),
    (
        "integer",
        "How many lines of Python are there (0-1000)? (does not fit any more)",
        {"type": "integer", "minimum": 0, "maximum": 1000},
        "import pathlib\n"
        "answer = min(1000, sum(len(p.read_text().splitlines())\n"
        "                       for p in pathlib.Path('/query/repo').rglob('*.py')))\n",
    ),
    (
        "boolean",
        "Does src/widgets/core.py define assemble()? (still fits)",
        {"type": "boolean"},
        "answer = 'def assemble' in open('/query/repo/src/widgets/core.py').read()\n",
    ),
]


def cost(schema: object) -> int:
    """The exact charge, from the local cost tool (free, no broker involved)."""
    done = subprocess.run(
        ["bounded-query-cost", "--json", "--schema", json.dumps(schema)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(json.loads(done.stdout)["chargeBits"])


def ask(repo: str, schema: object, body: str) -> str:
    """Ask one question through the wrapper; return its single output line."""
    script = "import json, os\n" + body + OUT
    done = subprocess.run(
        ["bounded-query", "--repo", repo, "--schema", json.dumps(schema)],
        input=script.encode(),
        capture_output=True,
        check=True,
    )
    return done.stdout.decode().strip()


def main() -> int:
    """Ask every question and print the ledger as it drains."""
    repos = os.environ.get("AWF_BOUNDED_QUERY_REPOS", "")
    print(f"repositories: {repos}")
    print(f"skill: {os.environ.get('AWF_BOUNDED_QUERY_SKILL')}")
    print(f"{REPO} is internal: {BUDGET} bits for the whole run\n")
    remaining = BUDGET
    header = f"{'kind':8} {'charge':>6} {'left':>5}  question -> answer"
    print(header)
    print("-" * len(header))
    for kind, question, schema, body in QUESTIONS:
        charge = cost(schema)
        fits = charge <= remaining
        answer = ask(REPO, schema, body)
        if fits:
            remaining -= charge
        note = "" if fits else f"   <- refused: {charge} bits > {remaining} left"
        print(f"{kind:8} {charge:>6} {remaining:>5}  {question}\n{'':22}-> {answer}{note}")
    sealed = ask(SEALED, {"type": "boolean"}, "answer = True\n")
    print(f"\n{SEALED} is sealed (0 bits): a boolean question -> {sealed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
