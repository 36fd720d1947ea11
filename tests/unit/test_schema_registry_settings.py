"""The schema registry's settings: listener syntax refused at start, and the URL registered for forwarding."""

from __future__ import annotations

import pytest

from pykbroker.config import BrokerConfig, ConfigError, schema_registry_advertised_url
from pykbroker.metadata import zk_layout as zl


@pytest.mark.parametrize(("value", "says"), [
    ("ftp://127.0.0.1:8081", "must be http://host:port or https://host:port"),
    ("http://127.0.0.1", "needs a host and a port"),
    ("http://127.0.0.1:8081/registry", "give no path"),
])
def test_bad_listeners_are_refused(value: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        BrokerConfig({"pykbroker.schema.registry.listener": value})


def test_compatibility_level_and_topic_are_checked() -> None:
    with pytest.raises(ConfigError, match="compatibility.level"):
        BrokerConfig({"pykbroker.schema.registry.compatibility.level": "SIDEWAYS"})
    with pytest.raises(ConfigError, match="legal topic name"):
        BrokerConfig({"pykbroker.schema.registry.topic": ""})
    c = BrokerConfig({})
    assert (c["pykbroker.schema.registry.listener"], c["pykbroker.schema.registry.topic"],
            c["pykbroker.schema.registry.compatibility.level"]) == ("", "_schemas", "BACKWARD")


def test_advertised_url_replaces_a_wildcard_host_unless_given() -> None:
    assert schema_registry_advertised_url("http://0.0.0.0:8081", "") == "http://127.0.0.1:8081"
    assert schema_registry_advertised_url("https://[::]:8081", "") == "https://[::1]:8081"
    assert schema_registry_advertised_url("http://10.0.0.5:8081", "") == "http://10.0.0.5:8081"
    assert schema_registry_advertised_url("http://0.0.0.0:8081", "https://sr.example:443") == "https://sr.example:443"


def test_the_registry_url_travels_in_the_broker_registration_and_kafka_fields_stay() -> None:
    reg = zl.BrokerRegistration(3, (("PLAINTEXT", "h", 9092),), {"PLAINTEXT": "PLAINTEXT"}, None,
                                "http://h:8081")
    data = zl.encode_broker(reg)
    back = zl.decode_broker(3, data)
    assert back.schema_registry_url == "http://h:8081" and back.endpoints == reg.endpoints
    assert zl.decode_broker(3, zl.encode_broker(zl.BrokerRegistration(3, reg.endpoints))).schema_registry_url is None
