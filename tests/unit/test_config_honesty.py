"""Settings pykbroker accepts but cannot honour fail at start; the README lists each of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pykbroker.config import (
    BROKER_CONFIG_DEFS,
    LONG_MAX,
    TOPIC_CONFIG_DEFS,
    BrokerConfig,
    ConfigError,
    load_config,
    parse_zk_connect,
    validate_topic_configs,
)

ROOT = Path(__file__).resolve().parents[2]
HINT = "(see README 'Settings not implemented')"


def test_zookeeper_connect_is_a_cluster_and_its_syntax_is_checked() -> None:
    c = BrokerConfig({"zookeeper.connect": "127.0.0.1:2181,127.0.0.1:2182/kafka/one"})
    assert c["zookeeper.connect"] == "127.0.0.1:2181,127.0.0.1:2182/kafka/one"
    assert c.no_effect_keys() == []
    assert parse_zk_connect("127.0.0.1:2181,zk2/kafka/one") == ([("127.0.0.1", 2181), ("zk2", 2181)], "/kafka/one")
    assert parse_zk_connect("[::1]:2182/") == ([("::1", 2182)], "")
    BrokerConfig({"zookeeper.connect": ""})  # empty: one broker with embedded metadata
    for bad, why in [("127.0.0.1:x", "invalid port"), (":2181", "names no host"), ("a:1,,b:2", "not of the form"),
                     ("a:1/kafka/", "empty path element"), ("a:1/kafka/../x", "relative path element"),
                     ("a:70000", "invalid port")]:
        with pytest.raises(ConfigError, match=f"zookeeper.connect.*{why}"):
            BrokerConfig({"zookeeper.connect": bad})
    with pytest.raises(ConfigError, match="broker.id=-1 is refused with zookeeper.connect"):
        BrokerConfig({"zookeeper.connect": "127.0.0.1:2181", "broker.id": "-1"})
    with pytest.raises(ConfigError, match="port 0 .* cannot be registered in ZooKeeper"):
        BrokerConfig({"zookeeper.connect": "127.0.0.1:2181", "listeners": "PLAINTEXT://127.0.0.1:0"})
    BrokerConfig({"listeners": "PLAINTEXT://127.0.0.1:0"})  # embedded metadata: as before


def test_tls_listeners_accepted_and_unimplemented_ssl_keys_refused() -> None:
    # Keystores are read at start (pykbroker.security.tls); the config refuses JKS, Kafka's default type.
    with pytest.raises(ConfigError, match="ssl.keystore.type=JKS .* is refused for listener SSL") as jks:
        BrokerConfig({"listeners": "SSL://127.0.0.1:9093"})
    assert str(jks.value).endswith("see README 'Settings not implemented')")
    c = BrokerConfig({"listeners": "SSL://127.0.0.1:9093", "listener.name.ssl.ssl.client.auth": "required",
                      "ssl.keystore.type": "PEM"})
    assert c.security_protocols == {"SSL": "SSL"}
    assert c.listener_value("SSL", "ssl.client.auth") == "required"
    with pytest.raises(ConfigError, match="ssl.keymanager.algorithm.*does not implement") as e:
        BrokerConfig({"ssl.keymanager.algorithm": "SunX509"})
    assert str(e.value).endswith("see README 'Settings not implemented')")
    with pytest.raises(ConfigError, match="ssl.client.auth"):
        BrokerConfig({"ssl.client.auth": "sometimes"})


def test_listener_names_resolve_through_the_protocol_map() -> None:
    ok = BrokerConfig({
        "listeners": "EXTERNAL://127.0.0.1:9092,INTERNAL://127.0.0.1:29092",
        "listener.security.protocol.map": "EXTERNAL:PLAINTEXT,INTERNAL:PLAINTEXT",
        "inter.broker.listener.name": "INTERNAL",
    })
    assert [lst.name for lst in ok.listeners] == ["EXTERNAL", "INTERNAL"]
    with pytest.raises(ConfigError, match="listener EXTERNAL has no entry in 'listener.security.protocol.map'"):
        BrokerConfig({"listeners": "EXTERNAL://127.0.0.1:9092"})
    with pytest.raises(ConfigError, match="listener.security.protocol.map"):
        BrokerConfig({"listener.security.protocol.map": "PLAINTEXT:TLS"})
    with pytest.raises(ConfigError, match="inter.broker.listener.name' names REPLICATION"):
        BrokerConfig({"inter.broker.listener.name": "REPLICATION"})


def test_cluster_settings_are_accepted() -> None:
    # Kafka accepts a replication factor above the live brokers and fails the topic creations instead.
    c = BrokerConfig({"default.replication.factor": "3", "controlled.shutdown.enable": "false",
                      "unclean.leader.election.enable": "true", "num.replica.fetchers": "2",
                      "inter.broker.listener.name": "PLAINTEXT", "broker.rack": "r1"})
    assert c["default.replication.factor"] == 3
    assert c["broker.rack"] == "r1"
    assert c.no_effect_keys() == []


def test_the_same_keys_at_their_defaults_are_accepted() -> None:
    c = BrokerConfig({
        "default.replication.factor": "1",
        "compression.type": "producer",
        "log.message.timestamp.after.max.ms": str(LONG_MAX),
    })
    assert c["default.replication.factor"] == 1
    assert c.no_effect_keys() == []


@pytest.mark.parametrize("key", ["ssl.keymanager.algorithm", "sasl.kerberos.service.name", "process.roles",
                                 "controller.quorum.voters", "zookeeper.set.acl"])
def test_kafka_keys_of_missing_features_are_named_as_such(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"unknown configuration '{re.escape(key)}': a Kafka setting pykbroker "
                                          r"does not implement .*see README 'Settings not implemented'"):
        BrokerConfig({key: "x"})
    with pytest.raises(ConfigError, match=r"^unknown configuration 'no\.such\.key'$"):
        BrokerConfig({"no.such.key": "x"})


def test_no_effect_keys_are_accepted_and_reported() -> None:
    c = BrokerConfig({"num.network.threads": "16", "num.io.threads": "4", "num.partitions": "3"})
    assert c.no_effect_keys() == ["num.io.threads", "num.network.threads"]
    with pytest.raises(ConfigError, match="num.io.threads"):
        BrokerConfig({"num.io.threads": "0"})


def test_recompression_and_timestamp_limits_are_implemented_so_accepted() -> None:
    # The produce path recompresses to the topic's codec and checks timestamps per record.
    assert BrokerConfig({"compression.type": "zstd"})["compression.type"] == "zstd"
    assert BrokerConfig({"log.message.timestamp.after.max.ms": "3600000"})["log.message.timestamp.after.max.ms"] \
        == 3600000
    assert validate_topic_configs({"compression.type": "zstd", "message.timestamp.after.max.ms": "1000"}) == {
        "compression.type": "zstd", "message.timestamp.after.max.ms": "1000"}
    assert validate_topic_configs({"compression.type": "producer", "cleanup.policy": "compact"}) == {
        "compression.type": "producer", "cleanup.policy": "compact"}


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"# {title}\n")
    end = text.find("\n#", start + 1)
    return text[start:end if end != -1 else None]


def test_readme_lists_every_setting_that_is_not_fully_implemented() -> None:
    section = _readme_section("Settings not implemented")
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    listed = {key for cell in first_cells for key in re.findall(r"`([a-z0-9_.]+)`", cell)}
    expected = {k for k, d in BROKER_CONFIG_DEFS.items() if d.no_effect or d.unsupported is not None}
    expected |= {k for k, d in TOPIC_CONFIG_DEFS.items() if d.unsupported is not None}
    assert expected - listed == set(), "README 'Settings not implemented' misses these keys"


def test_shipped_server_properties_loads_and_means_what_it_says(tmp_path: Path) -> None:
    path = ROOT / "config" / "server.properties"
    c = load_config(path, environ={})
    assert [(lst.name, lst.host, lst.port) for lst in c.listeners] == [("PLAINTEXT", "127.0.0.1", 9092)]
    assert c.log_dirs == [Path("data")]
    assert c["offsets.topic.replication.factor"] == 1
    assert c["group.initial.rebalance.delay.ms"] == 0
    assert c.no_effect_keys() == []  # the file sets nothing that is ignored
    # every key the file mentions, set or commented out, is one the broker knows and can honour
    mentioned = re.findall(r"^#?([a-z][a-z0-9.]+)=(.*)$", path.read_text(), re.M)
    assert len(mentioned) >= 10
    for key, value in mentioned:
        assert key in BROKER_CONFIG_DEFS, key
        BrokerConfig({key: value})
    # the environment and --override still win over the file
    c = load_config(path, [f"log.dirs={tmp_path}"], environ={"PYKBROKER_NUM_PARTITIONS": "4"})
    assert c.log_dirs == [tmp_path]
    assert c["num.partitions"] == 4


def _compose_environments(text: str) -> dict[str, dict[str, str]]:
    """Each top-level entry's and service's PYKBROKER_* variables (``${VAR:-default}`` as its default),
    with a ``<<: *anchor`` merge of another entry's variables resolved."""
    def expand(v: str) -> str:
        return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", v)
    chunks: dict[str, list[str]] = {}
    anchors: dict[str, str] = {}
    current = ""
    for line in text.splitlines():
        m = re.match(r"^(?:  )?([a-z][a-z0-9-]*):(?:\s*&([a-z-]+))?\s*$", line)
        if m and not line.startswith("   "):
            current = m[1]
            if m[2]:
                anchors[m[2]] = current
            chunks.setdefault(current, [])
        elif current:
            chunks[current].append(line)
    envs: dict[str, dict[str, str]] = {}
    for name, lines in chunks.items():
        body = "\n".join(lines)
        env = {k: expand(v) for k, v in re.findall(r'^\s+(PYKBROKER_[A-Z_]+):\s*"([^"]*)"', body, re.M)}
        for anchor in re.findall(r"^\s+<<: \*([a-z-]+)\s*$", body, re.M):
            merged = chunks.get(anchors.get(anchor, ""), [])
            base = {k: expand(v) for k, v in re.findall(r'^\s+(PYKBROKER_[A-Z_]+):\s*"([^"]*)"',
                                                         "\n".join(merged), re.M)}
            env = {**base, **env}
        envs[name] = env
    return envs


def test_compose_file_sets_only_settings_the_broker_honours() -> None:
    """docker/compose.yaml: the single broker runs with embedded metadata, the `cluster` profile's brokers
    join one ZooKeeper; every broker's environment loads with nothing refused and nothing ignored."""
    text = (ROOT / "docker" / "compose.yaml").read_text()
    envs = _compose_environments(text)
    single = envs["broker"]
    assert "PYKBROKER_LISTENERS" in single and "PYKBROKER_ZOOKEEPER_CONNECT" not in single
    c = load_config(ROOT / "docker" / "server.properties", environ=single)
    assert c.no_effect_keys() == []
    assert [lst.name for lst in c.listeners] == ["EXTERNAL", "INTERNAL"]
    cluster = {name: env for name, env in envs.items()
               if env.get("PYKBROKER_ZOOKEEPER_CONNECT") and not name.startswith("x-")}
    assert len(cluster) >= 3
    ids = set()
    for name, env in cluster.items():
        c = load_config(ROOT / "docker" / "server.properties", environ=env)
        assert c.no_effect_keys() == [], name
        assert c["zookeeper.connect"] and c["inter.broker.listener.name"] in {lst.name for lst in c.listeners}
        ids.add(c.broker_id)
    assert len(ids) == len(cluster), "every cluster broker has its own id"
