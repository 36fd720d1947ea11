"""ACL admin APIs end to end: CreateAcls/DescribeAcls/DeleteAcls through confluent-kafka, kafka-python and
the Java AdminClient against a broker with an ACL authorizer; ACLs survive a restart.  The PLAINTEXT
admin connection is ANONYMOUS, made a super user so these tests only exercise ACL management."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from tests.support.broker import BrokerProcess

TIMEOUT = 30.0
ACLS = {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer", "super.users": "User:ANONYMOUS"}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "acls", dict(ACLS))
    b.start()
    try:
        yield b
    finally:
        b.kill()


def _admin(b: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap, "broker.address.family": "v4"})


def _binding(name: str, principal: str = "User:alice", op: AclOperation = AclOperation.READ,
             pt: ResourcePatternType = ResourcePatternType.LITERAL, host: str = "*",
             perm: AclPermissionType = AclPermissionType.ALLOW) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, name, pt, principal, host, op, perm)


def _flt(rtype: ResourceType, name: str | None, pt: ResourcePatternType) -> AclBindingFilter:
    """Any principal, host, operation and permission (confluent's stubs do not admit None)."""
    none: Any = None
    return AclBindingFilter(rtype, name if name is not None else none, pt, none, none, AclOperation.ANY,
                            AclPermissionType.ANY)


ANY_FILTER = _flt(ResourceType.ANY, None, ResourcePatternType.ANY)


def _describe(admin: AdminClient, flt: AclBindingFilter = ANY_FILTER) -> set[tuple[object, ...]]:
    found = admin.describe_acls(flt, request_timeout=TIMEOUT).result(timeout=TIMEOUT)
    return {(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type)
            for b in found}


def _key(b: AclBinding) -> tuple[object, ...]:
    return (b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type)


def test_confluent_create_describe_delete_and_restart(broker: BrokerProcess) -> None:
    admin = _admin(broker)
    wanted = [_binding("payments"), _binding("pay", pt=ResourcePatternType.PREFIXED, op=AclOperation.WRITE),
              _binding("*", principal="User:*", op=AclOperation.DESCRIBE, perm=AclPermissionType.DENY,
                       host="10.0.0.1")]
    for fut in admin.create_acls(wanted, request_timeout=TIMEOUT).values():
        assert fut.result(timeout=TIMEOUT) is None
    assert _describe(admin) == {_key(b) for b in wanted}
    # MATCH: every pattern that applies to the topic "payments"
    match = _flt(ResourceType.TOPIC, "payments", ResourcePatternType.MATCH)
    assert _describe(admin, match) == {_key(b) for b in wanted}
    other = _flt(ResourceType.TOPIC, "orders", ResourcePatternType.MATCH)
    assert _describe(admin, other) == {_key(wanted[2])}

    broker.stop()
    broker.start()
    admin = _admin(broker)
    assert _describe(admin) == {_key(b) for b in wanted}

    prefixed = _flt(ResourceType.TOPIC, None, ResourcePatternType.PREFIXED)
    (fut,) = admin.delete_acls([prefixed], request_timeout=TIMEOUT).values()
    assert {_key(b) for b in fut.result(timeout=TIMEOUT)} == {_key(wanted[1])}
    assert _describe(admin) == {_key(wanted[0]), _key(wanted[2])}


def test_confluent_invalid_creation_is_refused_per_binding(broker: BrokerProcess) -> None:
    admin = _admin(broker)
    good = _binding("t1")
    bad = _binding("t2", host="not-an-address")
    futs = admin.create_acls([good, bad], request_timeout=TIMEOUT)
    assert futs[good].result(timeout=TIMEOUT) is None
    with pytest.raises(KafkaException) as e:
        futs[bad].result(timeout=TIMEOUT)
    assert e.value.args[0].code() == KafkaError.INVALID_REQUEST
    assert _describe(admin) == {_key(good)}


def test_without_authorizer_security_disabled(tmp_path: Path) -> None:
    from kafka.admin import (
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KRT
    from kafka.errors import SecurityDisabledError

    with BrokerProcess(tmp_path / "plain", {}) as b:
        confluent = _admin(b)  # keep a reference: a destroyed client fails its futures
        (fut,) = confluent.create_acls([_binding("t")], request_timeout=TIMEOUT).values()
        with pytest.raises(KafkaException) as e:
            fut.result(timeout=TIMEOUT)
        assert e.value.args[0].code() == KafkaError.SECURITY_DISABLED
        # (librdkafka does not surface DescribeAcls' top-level error: ask with kafka-python)
        admin = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=int(TIMEOUT * 1000))
        try:
            with pytest.raises(SecurityDisabledError, match="No Authorizer is configured"):
                admin.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                              ResourcePatternFilter(KRT.ANY, None, ACLResourcePatternType.ANY)))
        finally:
            admin.close()


def test_unknown_authorizer_class_fails_at_start(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "bad", {"authorizer.class.name": "com.example.MyAuthorizer"})
    with pytest.raises(RuntimeError, match="authorizer.class.name"):  # the broker exits; its log says why
        b.start(timeout=15)
    b.kill()


def test_kafka_python_admin(broker: BrokerProcess) -> None:
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as KRT

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=int(TIMEOUT * 1000))
    try:
        acl = ACL("User:bob", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                  ResourcePattern(KRT.GROUP, "g1", ACLResourcePatternType.LITERAL))
        result = admin.create_acls([acl])
        assert result["failed"] == [] and len(result["succeeded"]) == 1
        flt = ACLFilter("User:bob", None, ACLOperation.ANY, ACLPermissionType.ANY,
                        ResourcePatternFilter(KRT.ANY, None, ACLResourcePatternType.ANY))
        found, err = admin.describe_acls(flt)
        assert err.errno == 0
        assert [(a.principal, a.resource_pattern.resource_name, a.operation) for a in found] == \
            [("User:bob", "g1", ACLOperation.READ)]
        ((_, matched, err),) = admin.delete_acls([flt])
        assert err.errno == 0 and len(matched) == 1
        found, _ = admin.describe_acls(flt)
        assert found == []
    finally:
        admin.close()


JAVA = """
import java.util.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.acl.*;
import org.apache.kafka.common.resource.*;

public class AclTool {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        try (Admin admin = Admin.create(p)) {
            AclBinding b = new AclBinding(
                new ResourcePattern(ResourceType.TRANSACTIONAL_ID, "tx-", PatternType.PREFIXED),
                new AccessControlEntry("User:carol", "*", AclOperation.WRITE, AclPermissionType.ALLOW));
            admin.createAcls(List.of(b)).all().get();
            for (AclBinding f : admin.describeAcls(AclBindingFilter.ANY).values().get())
                System.out.println("DESCRIBED " + f);
            for (AclBinding f : admin.deleteAcls(List.of(b.toFilter())).all().get())
                System.out.println("DELETED " + f);
            System.out.println("LEFT " + admin.describeAcls(AclBindingFilter.ANY).values().get().size());
        }
    }
}
"""


def test_java_admin(broker: BrokerProcess, tmp_path: Path) -> None:
    from compat import env

    try:
        cp = os.pathsep.join(str(p) for p in env.jars())
    except Exception as e:  # the jars are fetched by compat setup
        pytest.fail(f"Java client jars unavailable (scripts/install.sh --test fetches them): {e}")
    src = tmp_path / "AclTool.java"
    src.write_text(JAVA)
    subprocess.run(["javac", "-nowarn", "-cp", cp, "-d", str(tmp_path), str(src)], check=True, timeout=120)
    out = subprocess.run(["java", "-Xmx256m", "-cp", os.pathsep.join([cp, str(tmp_path)]), "AclTool",
                          broker.bootstrap], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    described = [x for x in lines if x.startswith("DESCRIBED")]
    deleted = [x for x in lines if x.startswith("DELETED")]
    assert len(described) == 1 and "name=tx-" in described[0] and "patternType=PREFIXED" in described[0]
    assert "principal=User:carol" in described[0] and "operation=WRITE" in described[0]
    assert len(deleted) == 1 and "name=tx-" in deleted[0]
    assert "LEFT 0" in lines
