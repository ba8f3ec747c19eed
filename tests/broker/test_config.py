"""Broker config and seed map loading (broker/config.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bounded_query.broker.config import (
    BrokerConfig,
    ConfigError,
    SeedEntry,
    SeedMap,
    encode_config,
    encode_seed_map,
    load_config,
    load_seed_map,
    parse_config,
    parse_seed_map,
)
from bounded_query.broker.protocol import policy
from tests.broker.helpers import make_root


@pytest.fixture
def doc(tmp_path) -> dict:
    return make_root(tmp_path)


def test_valid_config(doc, tmp_path):
    config = parse_config(doc)
    assert config.run_id == doc["runId"]
    assert config.memory_bytes == 512 * 1024**2
    assert config.journal_path == tmp_path / "private" / "state" / "journal"
    assert config.ready_path == tmp_path / "private" / "control" / "ready"
    settings = config.runner_settings()
    assert settings.timeout_s == 30
    assert settings.run_id == config.run_id
    assert load_config(tmp_path / "broker.json") == config


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("version", 2, "version"),
        ("version", True, "version"),
        ("runId", "ABCDEF0123456789", "runId"),
        ("runId", "abc", "runId"),
        ("runId", "0123456789abcdef\n", "runId"),
        ("socketPath", "relative/sock", "socketPath"),
        ("socketPath", "/a/../b", "socketPath"),
        ("socketUid", -1, "socketUid"),
        ("socketGid", "0", "socketGid"),
        ("privateRoot", 7, "privateRoot"),
        ("runtime", "podman", "runtime"),
        ("timeout", 541, "timeout"),
        ("timeout", 0, "timeout"),
        ("timeout", 30.0, "timeout"),
        ("timeout", True, "timeout"),
        ("maxInvocations", 10001, "maxInvocations"),
        ("maxInvocations", 0, "maxInvocations"),
        ("memoryLimit", "lots", "memoryLimit"),
        ("memoryLimit", "1m", "memoryLimit"),
        ("image", "", "image"),
        ("image", "a b", "image"),
        ("dockerHost", "tcp://1.2.3.4:2375", "dockerHost"),
        ("hostPathMap", {"rel": "/x"}, "hostPathMap"),
        ("hostPathMap", [], "hostPathMap"),
    ],
)
def test_bad_values(doc, key, value, message):
    bad = copy.deepcopy(doc)
    bad[key] = value
    with pytest.raises(ConfigError, match=message):
        parse_config(bad)


@pytest.mark.parametrize("key", ["runId", "socketPath", "privateRoot", "timeout", "hostPathMap"])
def test_missing_keys(doc, key):
    bad = copy.deepcopy(doc)
    del bad[key]
    with pytest.raises(ConfigError, match=key):
        parse_config(bad)


def test_unknown_key_rejected(doc):
    with pytest.raises(ConfigError, match="unknown keys"):
        parse_config({**doc, "sensitivity": "public"})


def test_not_an_object():
    with pytest.raises(ConfigError, match="object"):
        parse_config([])


def test_load_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(bad)
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (1 << 20 + 1))
    with pytest.raises(ConfigError, match="larger"):
        load_config(huge)


def _seed_doc(tmp_path: Path) -> dict:
    make_root(tmp_path)
    return json.loads((tmp_path / "private" / "seed-map.json").read_text())


def test_seed_map_lookup_is_case_insensitive(tmp_path):
    doc = _seed_doc(tmp_path)
    seed_map = load_seed_map(tmp_path / "private" / "seed-map.json")
    assert seed_map == parse_seed_map(doc)
    entry = seed_map.lookup("OCTO/Internal")
    assert entry is not None
    assert entry.sensitivity == "internal"
    assert entry.budget_bits == 64
    budgets = {}
    for repo in ("octo/public", "octo/sealed", "octo/confidential"):
        found = seed_map.lookup(repo)
        assert found is not None
        budgets[repo] = found.budget_bits
    assert budgets == {"octo/public": None, "octo/sealed": 0, "octo/confidential": 8}
    assert seed_map.lookup("octo/other") is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(version=2), "version"),
        (lambda d: d.update(extra=1), "exactly"),
        (lambda d: d.update(repos={}), "array"),
        (lambda d: d["repos"][0].update(repo="bad"), "slug"),
        (lambda d: d["repos"][0].update(repo="octo/.."), "slug"),
        (lambda d: d["repos"][0].update(repo="octo/a\n"), "slug"),
        (lambda d: d["repos"][0].update(repo="octo/."), "slug"),
        (lambda d: d["repos"][0].update(repo=5), "slug"),
        (lambda d: d["repos"][0].update(repo="o" * 40 + "/r"), "slug"),
        (lambda d: d["repos"][0].update(seedId="../x"), "seedId"),
        (lambda d: d["repos"][0].update(sensitivity="secret"), "sensitivity"),
        (lambda d: d["repos"][0].update(commit="abc"), "commit"),
        (lambda d: d["repos"][0].update(more=1), "exactly"),
        (lambda d: d["repos"].append(dict(d["repos"][0], repo="OCTO/PUBLIC")), "duplicate"),
    ],
)
def test_bad_seed_maps(tmp_path, mutate, message):
    doc = _seed_doc(tmp_path)
    mutate(doc)
    with pytest.raises(ConfigError, match=message):
        parse_seed_map(doc)


# --- the codec: one module encodes and decodes both documents ---------------------------

_names = st.sampled_from(["a", "octo", "x-1", "repo_2", "dot.ted", "Z9"])
_slugs = st.tuples(st.sampled_from(["octo", "a", "Org-9"]), _names).map("/".join)
_paths = st.lists(_names, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))
_hex = lambda n: st.binary(min_size=n, max_size=n).map(bytes.hex)  # noqa: E731
_ids = st.none() | st.integers(min_value=0, max_value=2**32 - 1)


@given(
    run_id=_hex(16) | _hex(32),
    socket=_paths,
    uid=_ids,
    gid=_ids,
    root=_paths,
    runtime=st.sampled_from(policy.RUNTIMES),
    timeout=st.integers(policy.MIN_TIMEOUT_S, policy.MAX_TIMEOUT_S),
    memory=st.sampled_from(["6m", "512m", "1g", "64g", "104857600"]),
    invocations=st.integers(policy.MIN_INVOCATIONS, policy.MAX_INVOCATIONS),
    path_map=st.dictionaries(_paths, _paths, max_size=3),
)
def test_config_round_trips_through_its_codec(
    run_id, socket, uid, gid, root, runtime, timeout, memory, invocations, path_map
):
    config = BrokerConfig(
        run_id=run_id,
        socket_path=Path(socket),
        socket_uid=uid,
        socket_gid=gid,
        private_root=Path(root),
        seed_map_path=Path(root) / "seed-map.json",
        runtime=runtime,
        timeout_s=timeout,
        memory_limit=memory,
        memory_bytes=policy.parse_memory_limit(memory),
        max_invocations=invocations,
        image=policy.DEFAULT_IMAGE,
        docker_host=policy.DEFAULT_DOCKER_HOST,
        host_path_map=tuple(sorted(path_map.items())),
    )
    document = json.loads(json.dumps(encode_config(config)))
    assert parse_config(document) == config


@given(
    st.lists(
        st.tuples(
            _slugs,
            _hex(16),
            st.sampled_from(policy.SENSITIVITIES),
            _hex(20),
        ),
        max_size=5,
        unique_by=lambda t: t[0].lower(),
    )
)
def test_seed_map_round_trips_through_its_codec(rows):
    seed_map = SeedMap(
        {repo.lower(): SeedEntry(repo, sid, sens, commit) for repo, sid, sens, commit in rows}
    )
    document = json.loads(json.dumps(encode_seed_map(seed_map)))
    decoded = parse_seed_map(document)
    assert decoded == seed_map
    assert list(decoded.entries) == list(seed_map.entries)
