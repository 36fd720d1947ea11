"""``pykbroker acl list|create|delete``: ACL bindings (DescribeAcls, CreateAcls, DeleteAcls)."""

from __future__ import annotations

from typing import Any

import click
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from ..describe import OPERATION_CODES, PATTERN_CODES, RESOURCE_CODES, describe_acls
from ..session import Session, connection_options

# The options' choices: Kafka's names (lower case, dashes), "any" first.
RESOURCE_TYPES = tuple(RESOURCE_CODES)
PATTERNS = tuple(PATTERN_CODES)
OPERATIONS = tuple(OPERATION_CODES)


def _enum(cls: Any, text: str) -> Any:
    return cls[text.upper().replace("-", "_")]


def _filter(resource_type: str, name: str | None, pattern: str, principal: str | None, host: str | None,
            operation: str, permission: str, binding: bool) -> Any:
    """An AclBinding (create: every field concrete) or AclBindingFilter (list and delete: None matches any)."""
    cls: Any = AclBinding if binding else AclBindingFilter
    rtype = ResourceType.BROKER if resource_type == "cluster" else _enum(ResourceType, resource_type)
    if resource_type == "cluster" and binding:
        name = name or "kafka-cluster"
    return cls(rtype, name, _enum(ResourcePatternType, pattern), principal, host, _enum(AclOperation, operation),
               _enum(AclPermissionType, permission))


def _doc(b: Any) -> dict[str, Any]:
    rtype = "cluster" if b.restype.name == "BROKER" else b.restype.name.lower().replace("_", "-")
    return {"principal": b.principal, "host": b.host, "operation": b.operation.name.lower().replace("_", "-"),
            "permission": b.permission_type.name.lower(), "resource_type": rtype, "resource_name": b.name,
            "pattern": b.resource_pattern_type.name.lower()}


def _show(session: Session, bindings: list[Any]) -> None:
    _emit(session, [_doc(b) for b in bindings])


def _emit(session: Session, docs: list[dict[str, Any]]) -> None:
    docs = sorted(docs, key=lambda d: tuple(str(v) for v in d.values()))
    keys = ["principal", "host", "operation", "permission", "resource_type", "resource_name", "pattern"]
    session.out.emit(docs, [k.upper().replace("_", "-") for k in keys], [[d[k] for k in keys] for d in docs])


def _options(f: Any, concrete: bool) -> Any:
    kinds = RESOURCE_TYPES[1:] if concrete else RESOURCE_TYPES
    pats = ("literal", "prefixed") if concrete else PATTERNS
    ops = OPERATIONS[1:] if concrete else OPERATIONS
    perms = ("allow", "deny") if concrete else ("any", "allow", "deny")
    for option in reversed([
        click.option("--resource-type", type=click.Choice(kinds), default=None if concrete else "any",
                     required=concrete),
        click.option("--resource-name", default=None, help="the topic, group, ... name (cluster: kafka-cluster)"),
        click.option("--pattern", type=click.Choice(pats), default="literal" if concrete else "any",
                     show_default=True),
        click.option("--principal", required=concrete, default=None, help="User:alice"),
        click.option("--host", default="*" if concrete else None, show_default=concrete),
        click.option("--operation", type=click.Choice(ops), required=concrete, default=None if concrete else "any"),
        click.option("--permission", type=click.Choice(perms), default="allow" if concrete else "any",
                     show_default=True),
    ]):
        f = option(f)
    return f


@click.group("acl")
def acl() -> None:
    """ACL bindings: who may do what on which resource."""


def _list(session: Session, **kw: Any) -> None:
    """ACL bindings matching the options (all by default)."""
    a = _args(kw)
    _emit(session, describe_acls(session.wire, a["resource_type"], a["name"], a["pattern"], a["principal"],
                                 a["host"], a["operation"], a["permission"]))


def _create(session: Session, **kw: Any) -> None:
    """Create one ACL binding."""
    admin = session.admin
    binding = _filter(binding=True, **_args(kw))
    admin.wait(admin.client.create_acls([binding], request_timeout=admin.timeout)[binding], "create ACL")
    _show(session, [binding])


def _delete(session: Session, **kw: Any) -> None:
    """Delete the ACL bindings matching the options; shows those deleted."""
    admin = session.admin
    flt = _filter(binding=False, **_args(kw))
    deleted = admin.wait(admin.client.delete_acls([flt], request_timeout=admin.timeout)[flt], "delete ACLs")
    _show(session, list(deleted))


def _args(kw: dict[str, Any]) -> dict[str, Any]:
    return {"resource_type": kw["resource_type"], "name": kw["resource_name"], "pattern": kw["pattern"],
            "principal": kw["principal"], "host": kw["host"], "operation": kw["operation"],
            "permission": kw["permission"]}


acl.command("list")(_options(connection_options(_list), concrete=False))
acl.command("create")(_options(connection_options(_create), concrete=True))
acl.command("delete")(_options(connection_options(_delete), concrete=False))

COMMANDS = (acl,)
