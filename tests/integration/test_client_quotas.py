"""DescribeClientQuotas / AlterClientQuotas (KIP-546): stored as Kafka validates and matches them.

Through kafka-python (its own protocol classes and version negotiation; neither confluent-kafka
nor aiokafka has these calls; the Java client's admin is exercised by the compat suite), and both
versions of each API through raw kio requests.  Enforcement is tested in test_quota_enforcement.py
(byte rates), test_quota_principals.py (request time, users), test_quota_mutations.py (controller
mutations) and test_quota_connections.py (IP connection rates).
"""

from __future__ import annotations

import pytest

from tests.integration.conftest import BrokerFactory, RawConnection
from tests.support.broker import BrokerProcess
from tests.support.quotas import Entity, KpQuotas

EXACT, DEFAULT, ANY = 0, 1, 2
INVALID_REQUEST, UNSUPPORTED_VERSION, UNKNOWN_SERVER_ERROR = 42, 35, -1


@pytest.fixture(scope="module")
def broker(module_broker_factory: BrokerFactory) -> BrokerProcess:
    return module_broker_factory()


def test_set_describe_and_remove_through_kafka_python(kp: KpQuotas, broker: BrokerProcess) -> None:
    alice = (("user", "kp-alice"),)
    alice_app = (("client-id", "kp-app"), ("user", "kp-alice"))
    default_user = (("user", None),)
    app = (("client-id", "kp-app"),)
    assert kp.alter(alice, {"producer_byte_rate": 1024.0, "request_percentage": 12.5}) == (0, None)
    assert kp.alter(alice_app, {"consumer_byte_rate": 2048.0}) == (0, None)
    assert kp.alter(default_user, {"controller_mutation_rate": 3.0}) == (0, None)
    assert kp.alter(app, {"producer_byte_rate": 4096.0}) == (0, None)

    # Exact user, not strict: every entity naming that user.
    assert kp.entries([("user", EXACT, "kp-alice")]) == {
        alice: {"producer_byte_rate": 1024.0, "request_percentage": 12.5},
        alice_app: {"consumer_byte_rate": 2048.0}}
    # Strict: only entities with exactly the filtered types.
    assert kp.entries([("user", EXACT, "kp-alice")], strict=True) == {
        alice: {"producer_byte_rate": 1024.0, "request_percentage": 12.5}}
    # The default user entity.
    assert kp.entries([("user", DEFAULT, None)], strict=True) == {default_user: {"controller_mutation_rate": 3.0}}
    # Any user (the default included), combined with an exact client id.
    assert kp.entries([("user", ANY, None), ("client-id", EXACT, "kp-app")]) == {
        alice_app: {"consumer_byte_rate": 2048.0}}
    everything = kp.entries([])
    assert {alice, alice_app, default_user, app} <= set(everything)
    assert kp.entries([], strict=True) == {}

    # Changing one key keeps the others; removing the last key removes the entity.
    assert kp.alter(alice, {"producer_byte_rate": 999.0, "request_percentage": None}) == (0, None)
    assert kp.entries([("user", EXACT, "kp-alice")], strict=True) == {alice: {"producer_byte_rate": 999.0}}
    assert kp.alter(alice, {"producer_byte_rate": None}) == (0, None)
    assert kp.entries([("user", EXACT, "kp-alice")], strict=True) == {}
    # Removing a key that is not set is not an error.
    assert kp.alter(alice, {"consumer_byte_rate": None}) == (0, None)

    # validate_only checks but stores nothing.
    assert kp.alter(alice, {"producer_byte_rate": 5.0}, validate_only=True) == (0, None)
    assert kp.entries([("user", EXACT, "kp-alice")], strict=True) == {}

    # Every key is enforced (tests/integration/test_quota_*.py): the log has no "not enforced" line.
    assert broker.log().count("not enforced") == 0


@pytest.mark.parametrize(("entity", "ops", "code", "message"), [
    ((("user", "u1"),), {"connection_creation_rate": 5.0}, INVALID_REQUEST,
     "Invalid configuration key connection_creation_rate"),
    ((("ip", "127.0.0.1"),), {"producer_byte_rate": 5.0}, INVALID_REQUEST,
     "Invalid configuration key producer_byte_rate"),
    ((("user", "u1"),), {"producer_byte_rate": 1.5}, INVALID_REQUEST,
     "Configuration producer_byte_rate must be a Long value"),
    ((("ip", "127.0.0.1"),), {"connection_creation_rate": 2.5}, INVALID_REQUEST,
     "Configuration connection_creation_rate must be a Long value"),
    ((("ip", "not an address"),), {"connection_creation_rate": 5.0}, INVALID_REQUEST,
     "not an address is not a valid IP or resolvable host."),
    ((("ip", "127.0.0.1"), ("user", "u1")), {"connection_creation_rate": 5.0}, INVALID_REQUEST,
     "Invalid empty client quota entity"),
    ((("group", "g1"),), {"producer_byte_rate": 5.0}, INVALID_REQUEST,
     "Unhandled client quota entity type: group"),
    ((("user", ""),), {"producer_byte_rate": 5.0}, INVALID_REQUEST, "Empty user not supported"),
    ((), {"producer_byte_rate": 5.0}, INVALID_REQUEST, "Invalid empty client quota entity"),
    ((("user", "u1"),), {"SCRAM-SHA-256": 5.0}, UNKNOWN_SERVER_ERROR,
     "Unexpected config type STRING should be Long or Double"),
])
def test_alter_is_validated_as_kafka_does(kp: KpQuotas, entity: Entity, ops: dict[str, float | None], code: int,
                                          message: str) -> None:
    assert kp.alter(entity, ops) == (code, message)
    if entity and code:
        assert tuple(sorted(entity)) not in kp.entries([])


def test_ip_quotas_and_their_default(kp: KpQuotas, broker: BrokerProcess) -> None:
    assert kp.alter((("ip", "10.1.2.3"),), {"connection_creation_rate": 7.0}) == (0, None)
    assert kp.alter((("ip", "::1"),), {"connection_creation_rate": 9.0}) == (0, None)
    assert kp.alter((("ip", None),), {"connection_creation_rate": 100.0}) == (0, None)
    assert kp.entries([("ip", ANY, None)]) == {
        (("ip", "10.1.2.3"),): {"connection_creation_rate": 7.0},
        (("ip", "::1"),): {"connection_creation_rate": 9.0},
        (("ip", None),): {"connection_creation_rate": 100.0}}
    assert kp.entries([("ip", DEFAULT, None)]) == {(("ip", None),): {"connection_creation_rate": 100.0}}
    assert broker.log().count("not enforced") == 0
    # Enforced (tests/integration/test_quota_connections.py): removed so the module's other tests connect freely.
    for name in ("10.1.2.3", "::1", None):
        assert kp.alter((("ip", name),), {"connection_creation_rate": None}) == (0, None)


@pytest.mark.parametrize(("components", "code", "message"), [
    ([("user", EXACT, None)], INVALID_REQUEST, "Request specified MATCH_TYPE_EXACT, but set match string to null."),
    ([("user", DEFAULT, "x")], INVALID_REQUEST,
     "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."),
    ([("user", ANY, "x")], INVALID_REQUEST,
     "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."),
    ([("user", 7, None)], INVALID_REQUEST, "Unknown match type 7"),
    ([("user", ANY, None), ("user", EXACT, "a")], INVALID_REQUEST,
     "Entity type user cannot appear more than once in the filter."),
    ([("", ANY, None)], INVALID_REQUEST, "Invalid empty entity type."),
    ([("topic", ANY, None)], UNSUPPORTED_VERSION, "Unsupported entity type topic"),
    ([("ip", ANY, None), ("client-id", ANY, None)], INVALID_REQUEST,
     "Invalid entity filter component combination. IP filter component should not be used with user or "
     "clientId filter component."),
])
def test_describe_filters_are_validated_as_kafka_does(kp: KpQuotas, components: list[tuple[str, int, str | None]],
                                                      code: int, message: str) -> None:
    r = kp.describe(components)
    assert (r.error_code, r.error_message, r.entries) == (code, message, None)


def test_duplicates_in_one_request(broker: BrokerProcess) -> None:
    with RawConnection(broker) as c:
        r = c.request(49, 1, {"entries": [
            {"entity": [{"entity_type": "client-id", "entity_name": "dup"}],
             "ops": [{"key": "producer_byte_rate", "value": 10.0, "remove": False},
                     {"key": "producer_byte_rate", "value": 20.0, "remove": False}]}], "validate_only": False})
        (e,) = r.entries
        assert (int(e.error_code), e.error_message) == (
            INVALID_REQUEST, "Ignoring duplicate entity ClientQuotaEntity(entries={client-id=dup})")
        r = c.request(48, 1, {"components": [{"entity_type": "client-id", "match_type": EXACT, "match": "dup"}],
                              "strict": True})
        assert r.entries == ()
        # One entity twice: one answer for it, an error, and (as in Kafka) the first occurrence applied.
        # Entities are written in Kafka's map order: client-id before user.
        entity = [{"entity_type": "user", "entity_name": "u"}, {"entity_type": "client-id", "entity_name": "c"}]
        r = c.request(49, 1, {"entries": [
            {"entity": entity, "ops": [{"key": "producer_byte_rate", "value": 10.0, "remove": False}]},
            {"entity": entity[::-1], "ops": [{"key": "producer_byte_rate", "value": 20.0, "remove": False}]},
        ], "validate_only": False})
        (e,) = r.entries
        assert (int(e.error_code), e.error_message) == (
            INVALID_REQUEST, "Ignoring duplicate entity ClientQuotaEntity(entries={client-id=c, user=u})")
        assert [(x.entity_type, x.entity_name) for x in e.entity] == [("client-id", "c"), ("user", "u")]
        r = c.request(48, 1, {"components": [{"entity_type": "user", "match_type": EXACT, "match": "u"}],
                              "strict": False})
        assert [[(x.entity_type, x.entity_name) for x in en.entity] for en in r.entries] == [
            [("client-id", "c"), ("user", "u")]]
        assert r.entries[0].values[0].value == 10.0


@pytest.mark.parametrize("version", [0, 1])
def test_both_versions_over_raw_kio(broker: BrokerProcess, version: int) -> None:
    name = f"raw-v{version}"
    with RawConnection(broker) as c:
        r = c.request(49, version, {"entries": [
            {"entity": [{"entity_type": "client-id", "entity_name": name}],
             "ops": [{"key": "producer_byte_rate", "value": 1e6, "remove": False}]}], "validate_only": False})
        (e,) = r.entries
        assert int(e.error_code) == 0 and e.error_message is None
        assert [(x.entity_type, x.entity_name) for x in e.entity] == [("client-id", name)]
        r = c.request(48, version, {"components": [{"entity_type": "client-id", "match_type": EXACT,
                                                     "match": name}], "strict": True})
        assert int(r.error_code) == 0 and r.error_message is None
        assert [([(x.entity_type, x.entity_name) for x in en.entity], [(v.key, v.value) for v in en.values])
                for en in r.entries] == [([("client-id", name)], [("producer_byte_rate", 1e6)])]


def test_quotas_survive_a_restart(broker_factory: BrokerFactory) -> None:
    b = broker_factory()
    kp = KpQuotas(b)
    try:
        assert kp.alter((("client-id", "keep"), ("user", "bob")), {"producer_byte_rate": 123.0}) == (0, None)
        assert kp.alter((("user", None),), {"request_percentage": 50.0}) == (0, None)
    finally:
        kp.close()
    b.stop()
    b.start()
    kp = KpQuotas(b)
    try:
        assert kp.entries([("user", ANY, None)]) == {
            (("client-id", "keep"), ("user", "bob")): {"producer_byte_rate": 123.0},
            (("user", None),): {"request_percentage": 50.0}}
    finally:
        kp.close()
