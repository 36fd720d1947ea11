"""ACL model, filter matching, CreateAcls validation and StandardAuthorizer decisions."""

from __future__ import annotations

import pytest

from pykbroker.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclError,
    PatternType,
    PermissionType,
    ResourcePattern,
    binding_from_json,
    binding_to_json,
    entry_to_json,
    filter_unknown_reason,
    validate_binding,
)
from pykbroker.security.acl_authorizer import AclAuthorizer, parse_super_users
from pykbroker.security.authorizer import AclOperation as Op
from pykbroker.security.authorizer import ResourceType as RT
from pykbroker.security.principal import KafkaPrincipal

ALICE = KafkaPrincipal("User", "alice")
BOB = KafkaPrincipal("User", "bob")
H = "10.0.0.1"
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = PermissionType.ALLOW, PermissionType.DENY


def acl(name: str, op: Op, perm: PermissionType = ALLOW, *, who: str = "User:alice", host: str = "*",
        rtype: RT = RT.TOPIC, pt: PatternType = LIT) -> AclBinding:
    return AclBinding(ResourcePattern(int(rtype), name, pt), AccessControlEntry(who, host, op, perm))


def authz(*bindings: AclBinding, **kw: object) -> AclAuthorizer:
    a = AclAuthorizer(**kw)  # type: ignore[arg-type]
    a.load(bindings)
    return a


def test_no_acl_denies_by_default_and_allow_everyone_allows() -> None:
    assert not authz().authorize(ALICE, H, Op.READ, RT.TOPIC, "t")
    assert authz(allow_everyone_if_no_acl_found=True).authorize(ALICE, H, Op.READ, RT.TOPIC, "t")
    # an ACL for someone else on the resource: allow.everyone no longer applies
    a = authz(acl("t", Op.READ, who="User:bob"), allow_everyone_if_no_acl_found=True)
    assert not a.authorize(ALICE, H, Op.READ, RT.TOPIC, "t")
    assert a.authorize(ALICE, H, Op.READ, RT.TOPIC, "other")


def test_literal_wildcard_and_prefixed_patterns() -> None:
    a = authz(acl("t1", Op.READ), acl("*", Op.WRITE), acl("pay", Op.DELETE, pt=PRE))
    assert a.authorize(ALICE, H, Op.READ, RT.TOPIC, "t1")
    assert not a.authorize(ALICE, H, Op.READ, RT.TOPIC, "t10")
    assert a.authorize(ALICE, H, Op.WRITE, RT.TOPIC, "anything")
    assert a.authorize(ALICE, H, Op.DELETE, RT.TOPIC, "payments")
    assert a.authorize(ALICE, H, Op.DELETE, RT.TOPIC, "pay")
    assert not a.authorize(ALICE, H, Op.DELETE, RT.TOPIC, "pa")
    assert not a.authorize(ALICE, H, Op.DELETE, RT.TOPIC, "xpayments")
    assert not a.authorize(ALICE, H, Op.READ, RT.GROUP, "t1")  # other resource type


def test_deny_wins_over_allow_from_any_pattern() -> None:
    a = authz(acl("*", Op.ALL), acl("secret", Op.READ, DENY, pt=PRE))
    assert a.authorize(ALICE, H, Op.READ, RT.TOPIC, "public")
    assert not a.authorize(ALICE, H, Op.READ, RT.TOPIC, "secret-1")
    assert a.authorize(ALICE, H, Op.WRITE, RT.TOPIC, "secret-1")
    b = authz(acl("t", Op.READ), acl("t", Op.ALL, DENY, who="User:*"))
    assert not b.authorize(ALICE, H, Op.READ, RT.TOPIC, "t")
    assert not b.authorize(ALICE, H, Op.DESCRIBE, RT.TOPIC, "t")


def test_principal_and_host_matching() -> None:
    a = authz(acl("t", Op.READ, who="User:*", host="10.0.0.1"), acl("u", Op.READ, who="User:bob"))
    assert a.authorize(ALICE, "10.0.0.1", Op.READ, RT.TOPIC, "t")
    assert a.authorize(BOB, "10.0.0.1", Op.READ, RT.TOPIC, "t")
    assert not a.authorize(ALICE, "10.0.0.2", Op.READ, RT.TOPIC, "t")
    assert a.authorize(BOB, "10.0.0.2", Op.READ, RT.TOPIC, "u")
    assert not a.authorize(ALICE, "10.0.0.2", Op.READ, RT.TOPIC, "u")


def test_implied_operations() -> None:
    for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER, Op.ALL):
        assert authz(acl("t", op)).authorize(ALICE, H, Op.DESCRIBE, RT.TOPIC, "t"), op
    assert not authz(acl("t", Op.CREATE)).authorize(ALICE, H, Op.DESCRIBE, RT.TOPIC, "t")
    assert authz(acl("t", Op.ALTER_CONFIGS)).authorize(ALICE, H, Op.DESCRIBE_CONFIGS, RT.TOPIC, "t")
    assert not authz(acl("t", Op.DESCRIBE_CONFIGS)).authorize(ALICE, H, Op.ALTER_CONFIGS, RT.TOPIC, "t")
    assert not authz(acl("t", Op.READ)).authorize(ALICE, H, Op.WRITE, RT.TOPIC, "t")
    assert authz(acl("t", Op.ALL)).authorize(ALICE, H, Op.ALTER_CONFIGS, RT.TOPIC, "t")
    # a DENY of READ does not deny DESCRIBE (implication only widens ALLOWs)
    a = authz(acl("t", Op.DESCRIBE), acl("t", Op.READ, DENY))
    assert a.authorize(ALICE, H, Op.DESCRIBE, RT.TOPIC, "t")


def test_super_users() -> None:
    assert parse_super_users(" User:admin ; User:broker;") == {"User:admin", "User:broker"}
    with pytest.raises(ValueError):
        parse_super_users("admin")
    a = authz(acl("t", Op.ALL, DENY, who="User:*"), super_users={"User:alice"})
    assert a.authorize(ALICE, H, Op.READ, RT.TOPIC, "t")
    assert not a.authorize(BOB, H, Op.READ, RT.TOPIC, "t")
    assert a.authorize_by_resource_type(ALICE, H, Op.WRITE, RT.TRANSACTIONAL_ID)


def test_authorize_by_resource_type() -> None:
    by = lambda a, p=ALICE: a.authorize_by_resource_type(p, H, Op.WRITE, RT.TRANSACTIONAL_ID)  # noqa: E731
    txn = RT.TRANSACTIONAL_ID
    assert not by(authz())
    assert by(authz(allow_everyone_if_no_acl_found=True))
    assert by(authz(acl("tx1", Op.WRITE, rtype=txn)))
    assert by(authz(acl("tx", Op.ALL, rtype=txn, pt=PRE)))
    assert not by(authz(acl("tx1", Op.READ, rtype=txn)))  # other operation (no implication here)
    assert not by(authz(acl("tx1", Op.WRITE, rtype=txn)), BOB)
    assert not by(authz(acl("tx1", Op.WRITE, rtype=txn), acl("tx1", Op.WRITE, DENY, rtype=txn)))
    assert not by(authz(acl("tx1", Op.WRITE, rtype=txn), acl("tx", Op.WRITE, DENY, rtype=txn, pt=PRE)))
    assert by(authz(acl("tx1", Op.WRITE, rtype=txn), acl("ty", Op.WRITE, DENY, rtype=txn, pt=PRE)))
    assert by(authz(acl("*", Op.WRITE, rtype=txn)))
    assert not by(authz(acl("tx1", Op.WRITE, rtype=txn), acl("*", Op.WRITE, DENY, rtype=txn)))
    assert not by(authz(acl("tx1", Op.WRITE, rtype=RT.TOPIC)))


def test_index_replaced_on_load() -> None:
    a = authz(acl("t", Op.READ))
    assert a.authorize(ALICE, H, Op.READ, RT.TOPIC, "t")
    a.load([])
    assert not a.authorize(ALICE, H, Op.READ, RT.TOPIC, "t")


def test_filters() -> None:
    lit, wild, pre = acl("payments", Op.READ), acl("*", Op.READ), acl("pay", Op.WRITE, DENY, pt=PRE)
    other = acl("orders", Op.READ, who="User:bob", host="1.2.3.4", rtype=RT.GROUP)
    everything = AclBindingFilter()
    assert all(everything.matches(b) for b in (lit, wild, pre, other))
    match = AclBindingFilter(int(RT.TOPIC), "payments", PatternType.MATCH)
    assert [b for b in (lit, wild, pre, other) if match.matches(b)] == [lit, wild, pre]
    exact = AclBindingFilter(int(RT.TOPIC), "pay", PatternType.ANY)
    assert [b for b in (lit, wild, pre, other) if exact.matches(b)] == [pre]
    assert not AclBindingFilter(int(RT.TOPIC), "pay", LIT).matches(pre)
    assert AclBindingFilter(principal="User:bob", host="1.2.3.4").matches(other)
    assert not AclBindingFilter(principal="User:bob", host="*").matches(other)
    assert AclBindingFilter(operation=int(Op.WRITE), permission=int(DENY)).matches(pre)
    assert not AclBindingFilter(operation=int(Op.WRITE), permission=int(ALLOW)).matches(pre)
    assert filter_unknown_reason(AclBindingFilter(resource_type=0)) is not None
    assert filter_unknown_reason(AclBindingFilter(operation=0)) is not None
    assert filter_unknown_reason(AclBindingFilter(pattern_type=PatternType.UNKNOWN)) is not None
    assert filter_unknown_reason(AclBindingFilter(permission=0)) is not None
    assert filter_unknown_reason(everything) is None


@pytest.mark.parametrize("args", [
    (1, "t", 3, "User:a", "*", 3, 3),       # ANY resource type
    (0, "t", 3, "User:a", "*", 3, 3),       # UNKNOWN resource type
    (2, "t", 1, "User:a", "*", 3, 3),       # ANY pattern type
    (2, "t", 2, "User:a", "*", 3, 3),       # MATCH pattern type
    (2, "t", 3, "User:a", "*", 1, 3),       # ANY operation
    (2, "t", 3, "User:a", "*", 0, 3),       # UNKNOWN operation
    (2, "t", 3, "User:a", "*", 3, 1),       # ANY permission
    (2, "", 3, "User:a", "*", 3, 3),        # empty name
    (2, "*", 4, "User:a", "*", 3, 3),       # prefixed wildcard
    (2, "t", 3, "alice", "*", 3, 3),        # principal without type
    (2, "t", 3, "User:a", "myhost", 3, 3),  # host not an address
    (4, "other", 3, "User:a", "*", 7, 3),   # cluster name
    (2, "t", 3, "User:a", "*", 9, 3),       # CLUSTER_ACTION on a topic
])
def test_create_validation_rejects(args: tuple[int, str, int, str, str, int, int]) -> None:
    with pytest.raises(AclError):
        validate_binding(*args)


def test_create_validation_accepts() -> None:
    b = validate_binding(2, "pay", 4, "User:*", "::1", 2, 2)
    assert b == acl("pay", Op.ALL, DENY, who="User:*", host="::1", pt=PRE)
    assert validate_binding(4, "kafka-cluster", 3, "User:a", "10.1.1.1", 7, 3).pattern.resource_type == RT.CLUSTER


def test_json_round_trip_kafka_names() -> None:
    b = acl("tx", Op.IDEMPOTENT_WRITE, DENY, rtype=RT.CLUSTER)
    assert entry_to_json(b.entry) == {"principal": "User:alice", "permissionType": "Deny",
                                      "operation": "IdempotentWrite", "host": "*"}
    assert binding_to_json(b)["resourceType"] == "Cluster"
    assert binding_from_json(binding_to_json(b)) == b  # type: ignore[arg-type]


def test_embedded_store_persists_and_notifies(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pykbroker.metadata.embedded import EmbeddedMetadataStore

    store = EmbeddedMetadataStore(tmp_path, 0, [("PLAINTEXT", "127.0.0.1", 9092)])
    store.start()
    a = AclAuthorizer()
    store.add_acl_listener(a.load)
    b1, b2 = acl("t", Op.READ), acl("p", Op.WRITE, pt=PRE)
    store.create_acls([b1, b2, b1])
    assert store.acls() == [b1, b2]
    assert a.authorize(ALICE, H, Op.WRITE, RT.TOPIC, "px")
    again = EmbeddedMetadataStore(tmp_path, 0, [("PLAINTEXT", "127.0.0.1", 9092)])
    again.start()
    assert again.acls() == [b1, b2]
    assert store.delete_acls([AclBindingFilter(pattern_type=PRE), AclBindingFilter(name="nothing")]) == [[b2], []]
    assert store.acls() == [b1]
    assert not a.authorize(ALICE, H, Op.WRITE, RT.TOPIC, "px")


def test_broker_refuses_authorizer_without_acl_storage() -> None:
    from types import SimpleNamespace

    from pykbroker.config import BrokerConfig
    from pykbroker.server.broker import Broker, StartupError

    config = BrokerConfig({"log.dirs": "/nonexistent", "authorizer.class.name":
                           "org.apache.kafka.metadata.authorizer.StandardAuthorizer"})
    fake = SimpleNamespace(config=config, store=SimpleNamespace(supports_acls=False), services=None)
    with pytest.raises(StartupError, match="ACL storage is not implemented"):
        Broker._start_authorizer(fake)  # type: ignore[arg-type]
