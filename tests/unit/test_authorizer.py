"""Authorized-operations bit fields, as Kafka computes them for each resource type."""

from __future__ import annotations

from pykbroker.protocol.header import RequestHeader
from pykbroker.security.authorizer import AUTHORIZED_OPERATIONS_OMITTED, AclOperation, ResourceType, to_bit_field
from pykbroker.security.authz import authorized_operations, maybe_authorized_operations
from pykbroker.security.principal import KafkaPrincipal
from pykbroker.security.request import RequestContext


class DenyWrites:
    def authorize(self, principal: KafkaPrincipal, host: str, operation: AclOperation, resource_type: ResourceType,
                  name: str) -> bool:
        return operation not in (AclOperation.WRITE, AclOperation.DELETE) or name == "open"

    def authorize_by_resource_type(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                                   resource_type: ResourceType) -> bool:
        return True


def _ctx_with(authorizer: DenyWrites) -> RequestContext:
    return RequestContext(RequestHeader(3, 12, 1, "c", 0), authorizer=authorizer)


def test_allow_all_bit_fields() -> None:
    # READ WRITE CREATE DELETE ALTER DESCRIBE DESCRIBE_CONFIGS ALTER_CONFIGS
    assert authorized_operations(ResourceType.TOPIC, "t") == 0b1101_1111_1000 == 3576
    # READ DELETE DESCRIBE DESCRIBE_CONFIGS ALTER_CONFIGS (Kafka 4)
    assert authorized_operations(ResourceType.GROUP, "g") == 0b1101_0100_1000 == 3400
    # CREATE ALTER DESCRIBE CLUSTER_ACTION DESCRIBE_CONFIGS ALTER_CONFIGS IDEMPOTENT_WRITE
    assert authorized_operations(ResourceType.CLUSTER, "kafka-cluster") == 0b1_1111_1010_0000 == 8096
    assert authorized_operations(ResourceType.TRANSACTIONAL_ID, "x") == (1 << 4) | (1 << 8)


def test_an_authorizer_removes_denied_operations() -> None:
    ctx = _ctx_with(DenyWrites())
    assert authorized_operations(ResourceType.TOPIC, "t", ctx=ctx) == 3576 - (1 << 4) - (1 << 6)
    assert authorized_operations(ResourceType.TOPIC, "open", ctx=ctx) == 3576
    assert authorized_operations(ResourceType.GROUP, "g", ctx=ctx) == 3400 - (1 << 6)


def test_omitted_unless_asked_and_int32() -> None:
    assert maybe_authorized_operations(False, ResourceType.TOPIC, "t") == AUTHORIZED_OPERATIONS_OMITTED
    assert maybe_authorized_operations(True, ResourceType.TOPIC, "t") == 3576
    assert to_bit_field(set()) == 0
    assert to_bit_field({AclOperation.READ}) == 8
