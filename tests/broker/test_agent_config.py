"""The bounded-agent broker config (broker/config.py: ``subsystem`` and ``enclave``)."""

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
    encode_config,
    load_config,
    parse_config,
)
from bounded_query.broker.protocol import policy
from bounded_query.broker.runner import EnclaveOptions
from bounded_query.broker.subsystem import BOUNDED_QUERY, subsystem_for
from tests.broker.agent_helpers import ENCLAVE, agent_doc
from tests.broker.helpers import make_root


@pytest.fixture
def doc(tmp_path: Path) -> dict[str, object]:
    return agent_doc(tmp_path)


def test_an_agent_config_carries_the_enclave_settings(doc: dict[str, object]) -> None:
    config = parse_config(doc)
    assert config.subsystem == policy.SUBSYSTEM_AGENT
    assert config.enclave == EnclaveOptions(
        engine="claude",
        model="claude-haiku-4-5",
        network="awf-bounded-agent-0123456789abcdef",
        proxy_address="172.30.0.2",
        proxy_port=8080,
        control_socket=Path("/var/tmp/awf-bounded-agent-private-0-x/control/proxy.sock"),
        nano_cpus=1_000_000_000,
        pids_limit=128,
        tmpfs_bytes=64 * 1024**2,
        max_output_bytes=8192,
        max_task_bytes=4096,
    )
    settings = config.runner_settings()
    assert settings.image == policy.ENCLAVE_IMAGES["claude"]
    assert settings.timeout_s == 120


def test_the_agent_subsystem_is_built_from_the_config(doc: dict[str, object]) -> None:
    doc["enclave"] = dict(ENCLAVE, maxTaskBytes=100)
    subsystem = subsystem_for(parse_config(doc))
    assert subsystem.name == policy.SUBSYSTEM_AGENT
    assert subsystem.max_body_bytes == 100
    assert subsystem.max_answer_bytes == ENCLAVE["maxOutputBytes"]


def test_a_query_config_without_subsystem_is_a_query_broker(tmp_path: Path) -> None:
    doc = make_root(tmp_path)
    assert "subsystem" not in doc
    config = parse_config(doc)
    assert config.subsystem == policy.SUBSYSTEM_QUERY
    assert config.enclave is None
    assert subsystem_for(config) is BOUNDED_QUERY
    # A query broker's document is what it was before the second subsystem.
    assert set(encode_config(config)) == set(doc)
    assert parse_config(encode_config(config)) == config


def test_agent_timeouts_reach_the_agent_bound(doc: dict[str, object]) -> None:
    doc["timeout"] = policy.MAX_AGENT_TIMEOUT_S
    assert parse_config(doc).timeout_s == policy.MAX_AGENT_TIMEOUT_S
    doc["timeout"] = policy.MAX_AGENT_TIMEOUT_S + 1
    with pytest.raises(ConfigError, match=r"^config\.timeout: .*spec 15\.2"):
        parse_config(doc)


def _set(key: str, value: object):
    def mutate(d: dict[str, object]) -> None:
        enclave = d["enclave"]
        assert isinstance(enclave, dict)
        enclave[key] = value

    return mutate


def _drop(key: str):
    def mutate(d: dict[str, object]) -> None:
        enclave = d["enclave"]
        assert isinstance(enclave, dict)
        del enclave[key]

    return mutate


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda d: d.update(subsystem="bounded-script"), "config.subsystem"),
        (lambda d: d.update(subsystem=None), "config.subsystem"),
        (lambda d: d.pop("enclave"), "config.enclave"),
        (lambda d: d.update(enclave=[]), "config.enclave"),
        (lambda d: d.update(runtime="sbx"), "config.runtime"),
        (_set("extra", 1), "config.enclave"),
        (_set("engine", "gemini"), "config.enclave.engine"),
        (_set("engine", "codex"), "config.enclave.engine"),
        (_set("model", ""), "config.enclave.model"),
        (_set("model", "a model"), "config.enclave.model"),
        (_set("model", "org/model"), "config.enclave.model"),
        (_set("model", "https://evil/v1"), "config.enclave.model"),
        (_set("model", 7), "config.enclave.model"),
        (_set("network", "-bad"), "config.enclave.network"),
        (_set("proxyAddress", "::1"), "config.enclave.proxyAddress"),
        (_set("proxyAddress", "172.30.0.02"), "config.enclave.proxyAddress"),
        (_set("proxyAddress", "awf-api-proxy"), "config.enclave.proxyAddress"),
        (_set("proxyPort", 0), "config.enclave.proxyPort"),
        (_set("proxyPort", 65536), "config.enclave.proxyPort"),
        (_set("proxyPort", True), "config.enclave.proxyPort"),
        (_set("proxyPort", "8080"), "config.enclave.proxyPort"),
        (_set("controlSocket", "relative/proxy.sock"), "config.enclave.controlSocket"),
        (_set("controlSocket", "/a/../b"), "config.enclave.controlSocket"),
        (_set("nanoCpus", 0), "config.enclave.nanoCpus"),
        (_set("pidsLimit", 0), "config.enclave.pidsLimit"),
        (_set("tmpfsBytes", 1), "config.enclave.tmpfsBytes"),
        (_set("maxOutputBytes", 0), "config.enclave.maxOutputBytes"),
        (_set("maxOutputBytes", 8193), "config.enclave.maxOutputBytes"),
        (_set("maxTaskBytes", 0), "config.enclave.maxTaskBytes"),
        (_set("maxTaskBytes", 65537), "config.enclave.maxTaskBytes"),
        (_set("maxTaskBytes", 4096.0), "config.enclave.maxTaskBytes"),
        *[(_drop(key), f"config.enclave.{key}") for key in ENCLAVE],
    ],
)
def test_bad_agent_configs_are_located(doc: dict[str, object], mutate: object, where: str) -> None:
    assert callable(mutate)
    mutate(doc)
    with pytest.raises(ConfigError) as caught:
        parse_config(doc)
    assert str(caught.value).startswith(where + ":"), str(caught.value)


def test_a_query_config_with_enclave_settings_is_refused(tmp_path: Path) -> None:
    doc = make_root(tmp_path)
    doc["enclave"] = copy.deepcopy(ENCLAVE)
    with pytest.raises(ConfigError, match=r"^config\.enclave: only a bounded-agent broker"):
        parse_config(doc)


def test_the_value_refuses_a_mismatched_subsystem(doc: dict[str, object]) -> None:
    config = parse_config(doc)
    fields = {name: getattr(config, name) for name in BrokerConfig.__slots__}
    with pytest.raises(ConfigError, match="required exactly"):
        BrokerConfig(**{**fields, "enclave": None})
    with pytest.raises(ConfigError, match=r"^config\.subsystem"):
        BrokerConfig(**{**fields, "subsystem": "other"})


def test_load_config_reads_an_agent_config(doc: dict[str, object], tmp_path: Path) -> None:
    assert load_config(tmp_path / "broker.json") == parse_config(doc)


_names = st.sampled_from(["a", "octo", "x-1", "repo_2", "dot.ted", "Z9"])
_paths = st.lists(_names, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))
_hex = st.binary(min_size=8, max_size=32).map(bytes.hex)


@st.composite
def enclave_options(draw: st.DrawFn) -> EnclaveOptions:
    return EnclaveOptions(
        engine=draw(st.sampled_from(policy.ENCLAVE_ENGINES)),
        model=draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,40}", fullmatch=True)),
        network=draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,60}", fullmatch=True)),
        proxy_address=str(draw(st.ip_addresses(v=4))),
        proxy_port=draw(st.integers(1, 65535)),
        control_socket=Path(draw(_paths)),
        nano_cpus=draw(st.integers(1, 1024 * 10**9)),
        pids_limit=draw(st.integers(1, 4 * 1024**2)),
        tmpfs_bytes=draw(st.integers(4096, policy.MAX_MEMORY_BYTES)),
        max_output_bytes=draw(st.integers(1, policy.ENCLAVE_MAX_OUTPUT_BYTES)),
        max_task_bytes=draw(st.integers(1, policy.ENCLAVE_MAX_TASK_BYTES)),
    )


@given(
    run_id=_hex,
    root=_paths,
    runtime=st.sampled_from(sorted(policy.ENCLAVE_OCI_RUNTIMES)),
    timeout=st.integers(policy.MIN_TIMEOUT_S, policy.MAX_AGENT_TIMEOUT_S),
    invocations=st.integers(policy.MIN_INVOCATIONS, policy.MAX_INVOCATIONS),
    options=enclave_options(),
)
def test_agent_configs_round_trip_through_the_codec(
    run_id: str, root: str, runtime: str, timeout: int, invocations: int, options: EnclaveOptions
) -> None:
    config = BrokerConfig(
        run_id=run_id,
        socket_path=Path(root) / "broker.sock",
        socket_uid=None,
        socket_gid=65534,
        private_root=Path(root),
        seed_map_path=Path(root) / "seed-map.json",
        runtime=runtime,
        timeout_s=timeout,
        memory_limit="512m",
        memory_bytes=512 * 1024**2,
        max_invocations=invocations,
        image=policy.ENCLAVE_IMAGES["claude"],
        docker_host=policy.DEFAULT_DOCKER_HOST,
        host_path_map=(),
        subsystem=policy.SUBSYSTEM_AGENT,
        enclave=options,
    )
    document = json.loads(json.dumps(encode_config(config)))
    assert parse_config(document) == config
