"""One source per fact: every shipped copy of a policy value agrees with broker/protocol/policy.py.

The JSON Schemas (the ``boundedQueries`` section, the audit and report
records), the generated SKILL.md, the MCP server's tool descriptions and the
docs repeat budgets, limits and names that the code takes from the policy
module; each test here fails when one copy drifts. The slug and memory-limit
rules are compared as text *and* by behaviour (the schema validator and the
Python functions must accept exactly the same strings).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from bounded_query.broker import runner
from bounded_query.broker.protocol import MAX_SLUG_CHARS, TIMING_BUCKETS_MS, is_valid_slug, policy
from bounded_query.harness.configuration import config as harness_config
from bounded_query.harness.staging.skill import render_skill
from bounded_query.wrapper import bounded_query_cost as cost_tool
from bounded_query.wrapper import bounded_query_mcp as mcp

REPO_ROOT = Path(__file__).resolve().parents[2]
SECTION_SCHEMA = REPO_ROOT / "harness" / "bounded-queries.schema.json"
RECORD_SCHEMAS = REPO_ROOT / "harness" / "schemas"


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def anchored(pattern: str) -> str:
    """How the schema files anchor a whole-string rule (ECMA-262 and Python alike)."""
    return "^" + pattern + "$(?![\\s\\S])"


SECTION = load(SECTION_SCHEMA)
PROPS = SECTION["properties"]


def test_section_schema_limits_are_the_policy():
    assert PROPS["timeout"] == {
        "type": "integer",
        "minimum": policy.MIN_TIMEOUT_S,
        "maximum": policy.MAX_TIMEOUT_S,
    }
    assert PROPS["maxInvocations"] == {
        "type": "integer",
        "minimum": policy.MIN_INVOCATIONS,
        "maximum": policy.MAX_INVOCATIONS,
    }
    assert PROPS["privateRepos"]["maxItems"] == policy.MAX_PRIVATE_REPOS
    assert tuple(PROPS["runtime"]["enum"]) == policy.RUNTIMES
    assert tuple(PROPS["interpreter"]["enum"]) == policy.INTERPRETERS
    entry = SECTION["$defs"]["repoEntry"]["properties"]
    assert tuple(entry["sensitivity"]["enum"]) == policy.SENSITIVITIES
    assert PROPS["memoryLimit"]["pattern"] == anchored(policy.MEMORY_LIMIT_PATTERN)
    slug = SECTION["$defs"]["slug"]
    assert slug["pattern"] == anchored(policy.SLUG_PATTERN)
    assert slug["maxLength"] == MAX_SLUG_CHARS


def test_defaults_satisfy_the_schema_and_the_preflight():
    validator = Draft202012Validator(SECTION)
    defaults = dict(policy.DEFAULTS)
    defaults["enabled"] = True
    assert list(validator.iter_errors(defaults)) == []
    assert set(policy.DEFAULTS) <= set(PROPS)
    assert policy.DEFAULT_RUNTIME in policy.RUNTIMES
    assert policy.DEFAULT_INTERPRETER in policy.INTERPRETERS
    assert policy.MIN_TIMEOUT_S <= policy.DEFAULT_TIMEOUT_S <= policy.MAX_TIMEOUT_S
    assert policy.MIN_INVOCATIONS <= policy.DEFAULT_MAX_INVOCATIONS <= policy.MAX_INVOCATIONS
    assert policy.parse_memory_limit(policy.DEFAULT_MEMORY_LIMIT) == 512 * 1024**2
    # The 540 s cap leaves the last minute of the 600 s bucket for cleanup.
    assert TIMING_BUCKETS_MS[-1] == policy.MAX_TIMEOUT_S * 1000 + 60_000


def test_defaults_flow_from_the_policy():
    """Where a default is a policy value, the code's default is that value."""
    assert harness_config.BoundedQueriesConfig().timeout == policy.DEFAULT_TIMEOUT_S
    assert runner.RunnerSettings("docker", "0" * 16, "i", 1, 1).docker_host == (
        policy.DEFAULT_DOCKER_HOST
    )
    assert set(policy.OCI_RUNTIMES.values()) == {policy.OCI_RUNC, policy.OCI_RUNSC}
    assert policy.AGENT_VARIABLES == (policy.ENV_SOCKET, policy.ENV_SKILL, policy.ENV_REPOS)


#: The production directories whose modules must not rebind policy names.
_PRODUCTION = ("broker", "sandbox", "wrapper", "seccomp", "harness")
_REPO_ROOT = Path(__file__).resolve().parents[2]


def _policy_rebindings(source: str, module: str) -> list[str]:
    """Every way ``source`` gives a policy name a second home (see the test below)."""
    names = set(policy.__all__)
    tree = ast.parse(source)
    imported: set[str] = set()
    found: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("policy"):
            for alias in node.names:
                imported.add(alias.asname or alias.name)
                if alias.asname and alias.asname != alias.name:
                    found.append(f"{module}: imports {alias.name} as {alias.asname}")
    for node in tree.body:
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        target_names = [t.id for t in targets if isinstance(t, ast.Name)]
        value = node.value
        aliased = (
            isinstance(value, ast.Attribute)
            and isinstance(value.value, ast.Name)
            and value.value.id == "policy"
        ) or (isinstance(value, ast.Name) and value.id in imported)
        if "__all__" in target_names and isinstance(value, ast.List | ast.Tuple):
            exported = {str(e.value) for e in value.elts if isinstance(e, ast.Constant)}
            found += [f"{module}: re-exports {n}" for n in sorted(exported & imported)]
        elif aliased:
            found += [f"{module}: {n} = {ast.unparse(value)}" for n in target_names]
        elif names & set(target_names):
            found += [f"{module}: redefines {n}" for n in sorted(names & set(target_names))]
    return found


def test_no_module_rebinds_a_policy_name():
    """One name per fact: policy values are imported from the policy, by their policy name.

    A module that re-exports a policy name, binds it to a second name
    (``X = policy.Y``, ``import Y as X``) or defines a name the policy owns
    gives the fact a second home that can drift or be patched apart.
    """
    found: list[str] = []
    for directory in _PRODUCTION:
        for path in sorted((_REPO_ROOT / directory).rglob("*.py")):
            if "example" in path.parts or path.name == "policy.py":
                continue
            found += _policy_rebindings(
                path.read_text(encoding="utf-8"), str(path.relative_to(_REPO_ROOT))
            )
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        "from bounded_query.broker.protocol.policy import RUN_BUDGETS\nBUDGET_BITS = RUN_BUDGETS\n",
        "from bounded_query.broker.protocol import policy\nX = policy.DEFAULT_IMAGE\n",
        "from .protocol.policy import QUERY_UID as UID\n",
        "from bounded_query.broker.protocol.policy import LABEL_RUN\n__all__ = ['LABEL_RUN']\n",
        "RUNTIMES = {'docker': 'runc'}\n",
    ],
)
def test_the_rebinding_check_catches_each_form(source):
    assert _policy_rebindings(source, "m") != []


def test_budgets():
    assert dict(policy.RUN_BUDGETS) == {
        "public": None,
        "internal": 64,
        "confidential": 8,
        "sealed": 0,
    }
    assert dict(policy.METERED_BUDGETS) == {"internal": 64, "confidential": 8, "sealed": 0}
    with pytest.raises(TypeError):
        policy.RUN_BUDGETS["internal"] = 1000  # type: ignore[index]


def test_record_schemas_name_the_policy_sensitivities():
    audit = load(RECORD_SCHEMAS / "bounded-query-audit.v1.schema.json")
    assert audit["properties"]["sensitivity"]["enum"] == [*policy.SENSITIVITIES, None]
    report = load(RECORD_SCHEMAS / "bounded-query-report.v1.schema.json")
    item = report["properties"]["repos"]["items"]["properties"]
    assert tuple(item["sensitivity"]["enum"]) == policy.SENSITIVITIES
    # The records' looser repo pattern accepts every configured slug.
    loose = re.compile(item["repo"]["pattern"])
    for slug in SLUGS_OK:
        assert loose.search(slug), slug


def test_cost_tool_skill_and_mcp_state_the_policy_budgets():
    protocol = cost_tool.load_protocol()
    assert cost_tool.run_budgets(protocol) == dict(policy.METERED_BUDGETS)
    text = cost_tool.render(cost_tool.assess(b'{"type":"boolean"}', protocol), protocol, False)
    for name, bits in policy.METERED_BUDGETS.items():
        assert f"{name} ({bits} bits)" in text
    budgets = policy.METERED_BUDGETS
    assert (
        f"internal {budgets['internal']} bits, confidential {budgets['confidential']},"
        f" sealed {budgets['sealed']}"
    ) in mcp.COST_DESCRIPTION
    repos = tuple(
        harness_config.PrivateRepo(f"o/r{i}", s) for i, s in enumerate(policy.SENSITIVITIES)
    )
    skill = render_skill(harness_config.BoundedQueriesConfig(True, repos))
    for name, bits in policy.METERED_BUDGETS.items():
        assert f"{bits} bits/run (`{name}`)" in skill
    assert f"how many fit in {budgets['internal']} bits (`internal`)" in skill


def test_docs_state_the_policy_budgets():
    text = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    budgets = policy.RUN_BUDGETS
    assert (
        f"public: unmetered, internal: {budgets['internal']},"
        f" confidential: {budgets['confidential']}"
    ) in " ".join(text.split())


SLUGS_OK = [
    "o/r",
    "octo/alpha",
    "a-b/c.d_e-f",
    "A" * 39 + "/" + "r" * 100,
    "o/.x",
    "o/x.",
    "o/.git",
    "0/_",
]
SLUGS_BAD = [
    "",
    "o",
    "/r",
    "o/",
    "o/.",
    "o/..",
    "o/a..b",
    "-o/r",
    "o-/r/x",
    "o.x/r",
    "o/r\n",
    "o/r ",
    " o/r",
    "o/r/",
    "A" * 40 + "/r",
    "o/" + "r" * 101,
    "https://github.com/o/r",
    "o/r?x",
    "o/r#x",
    "o/*",
    "o/\u0661",
    "\u0131/r",
]


@pytest.mark.parametrize("slug", SLUGS_OK + SLUGS_BAD)
def test_slug_rule_is_the_same_everywhere(slug):
    expected = slug in SLUGS_OK
    schema_ok = Draft202012Validator(SECTION["$defs"]["slug"]).is_valid(slug)
    assert is_valid_slug(slug) is expected
    assert (policy.SLUG_RE.fullmatch(slug) is not None) is expected
    assert schema_ok is expected


MEMORY_OK = ["6m", "512m", "512M", "1g", "64g", "6291456", "6291456b", "6144k", "0" * 14 + "6m"]
MEMORY_BAD = ["", "m", "5m", "65g", "1.5g", "1gb", "1t", "-1g", " 1g", "1g\n", "\u0661g", "1" * 16]


@pytest.mark.parametrize("text", MEMORY_OK + MEMORY_BAD)
def test_memory_rule_shape_is_the_schemas(text):
    """The schema checks the shape; parse_memory_limit the shape and the range."""
    shape_ok = Draft202012Validator(PROPS["memoryLimit"]).is_valid(text)
    assert shape_ok is (re.fullmatch(policy.MEMORY_LIMIT_PATTERN, text) is not None)
    try:
        policy.parse_memory_limit(text)
    except ValueError:
        parsed = False
    else:
        parsed = True
    assert parsed is (text in MEMORY_OK)
    if parsed:
        assert shape_ok


def test_shell_copies_name_the_policy_values():
    """Shell cannot import the policy: its copies are checked here."""
    action = (REPO_ROOT / ".github" / "action" / "bq-action.sh").read_text(encoding="utf-8")
    assert "\n    " + "|".join(policy.LAUNCHABLE_RUNTIMES) + ")\n" in action
    images = (REPO_ROOT / ".ci" / "build-images").read_text(encoding="utf-8")
    assert f"sandbox/image/build.sh {policy.DEFAULT_IMAGE}\n" in images
    required = (REPO_ROOT / ".ci" / "require-provisioned").read_text(encoding="utf-8")
    assert f"for image in {policy.DEFAULT_IMAGE} " in required
    engine = (REPO_ROOT / ".ci" / "provision-engine").read_text(encoding="utf-8")
    oci = policy.OCI_RUNTIMES[policy.RUNTIME_GVISOR]
    assert f'{{"runtimes": {{"{oci}": {{"path": "/usr/bin/{oci}"' in engine


def test_audit_categories_are_distinct_and_fit_the_audit_record():
    """Each category is one policy name; the shipped audit schema accepts every one."""
    names = [n for n in policy.__all__ if n.startswith("CATEGORY_")]
    values = [getattr(policy, n) for n in names]
    assert len(set(values)) == len(values) > 30
    schema = load(RECORD_SCHEMAS / "bounded-query-audit.v1.schema.json")["properties"]["category"]
    pattern = re.compile(schema["pattern"])
    for value in values:
        assert pattern.fullmatch(value), value
        assert len(value) <= schema["maxLength"]
