"""The secured target of the security scenarios: a SASL_PLAINTEXT listener, its users and ACL helpers.

The pykbroker the suite starts gets, besides its PLAINTEXT listener, a ``SASL_PLAINTEXT`` listener
(PLAIN and SCRAM-SHA-512) and Kafka's StandardAuthorizer with ``allow.everyone.if.no.acl.found=false``.
``super.users`` is ``User:admin;User:ANONYMOUS``: the PLAINTEXT listener's principal is ANONYMOUS, so every
other scenario keeps working unchanged, while over SASL the users alice and bob get only the ACLs a
scenario gives them. The PLAIN users live in the listener's JAAS config; the SCRAM credentials are created
at the start of the run through AlterUserScramCredentials (as admin), as on a real Kafka.
"""

from __future__ import annotations

import time
from typing import Any

from compat.clients.base import ClientError, Sasl

SASL_LISTENER = "SASL_PLAINTEXT"
PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
# Test-only passwords (the same for PLAIN and SCRAM-SHA-512).
PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
SCRAM_USERS = ("alice", "bob")
SCRAM_MECHANISM = "SCRAM-SHA-512"
SCRAM_ITERATIONS = 8192


# Kafka's codes (the DescribeAcls filter of wire.describe_acls).
RESOURCE_TYPES = {"TOPIC": 2, "GROUP": 3, "CLUSTER": 4, "TRANSACTIONAL_ID": 5}
PATTERN_TYPES = {"LITERAL": 3, "PREFIXED": 4}
OPERATIONS = {"ALL": 2, "READ": 3, "WRITE": 4, "CREATE": 5, "DELETE": 6, "ALTER": 7, "DESCRIBE": 8,
              "CLUSTER_ACTION": 9, "DESCRIBE_CONFIGS": 10, "ALTER_CONFIGS": 11, "IDEMPOTENT_WRITE": 12}
PERMISSIONS = {"DENY": 2, "ALLOW": 3}


def identity(user: str, mechanism: str = "PLAIN", password: str | None = None) -> Sasl:
    return Sasl(mechanism, user, PASSWORDS[user] if password is None else password)


def plain_jaas() -> str:
    users = " ".join(f'user_{u}="{p}"' for u, p in PASSWORDS.items())
    return f'{PLAIN_LOGIN_MODULE} required {users};'


AUTHORIZER_KEYS = ("authorizer.class.name", "super.users", "allow.everyone.if.no.acl.found")


def broker_overrides(authorizer: bool = True) -> dict[str, str]:
    """Settings (besides listeners) that give a broker the secured listener and the authorizer."""
    prefix = f"listener.name.{SASL_LISTENER.lower()}."
    out = {
        f"{prefix}sasl.enabled.mechanisms": f"PLAIN,{SCRAM_MECHANISM}",
        f"{prefix}plain.sasl.jaas.config": plain_jaas(),
        f"{prefix}{SCRAM_MECHANISM.lower()}.sasl.jaas.config": f"{SCRAM_LOGIN_MODULE} required;",
        "authorizer.class.name": AUTHORIZER,
        "super.users": "User:admin;User:ANONYMOUS",
        "allow.everyone.if.no.acl.found": "false",
    }
    return out if authorizer else {k: v for k, v in out.items() if k not in AUTHORIZER_KEYS}


def authorizer_refused(log_text: str) -> bool:
    """The broker exited because it does not implement the authorizer settings (a pykbroker build without
    ACLs says so at start). The suite then starts it without them: its ApiVersions lacks the ACL APIs, so
    the ACL scenarios are "not supported by the broker", and the run's label says so."""
    # "unknown configuration 'authorizer.class.name': ... does not implement", or "authorizer.class.name is
    # set but ACL storage is not implemented for this metadata store (ZooKeeper)".
    return "authorizer.class.name" in log_text and ("does not implement" in log_text
                                                    or "not implemented" in log_text)


# --- setup through confluent-kafka's AdminClient as admin ----------------------------------------

def admin_client(sasl_bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    from compat.clients.confluent import security_conf

    return AdminClient({"bootstrap.servers": sasl_bootstrap, "client.id": "compat-security-admin",
                        **security_conf(identity("admin"))})


def _raise(e: BaseException) -> None:
    from compat.clients.confluent import to_client_error

    raise to_client_error(e) from None


def create_scram_users(sasl_bootstrap: str, timeout: float = 60.0) -> None:
    """SCRAM-SHA-512 credentials for SCRAM_USERS (AlterUserScramCredentials, as admin over PLAIN).

    Retried while the broker is not ready yet (e.g. a cluster still electing its controller)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    admin = admin_client(sasl_bootstrap)
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
    ups = [UserScramCredentialUpsertion(u, info, PASSWORDS[u].encode()) for u in SCRAM_USERS]
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    for _ in range(1000):
        try:
            for f in admin.alter_user_scram_credentials(ups, request_timeout=30).values():
                f.result(timeout=30)
            _check_scram_users(admin)
            return
        except KafkaException as e:
            last = e
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    raise RuntimeError(f"could not create the SCRAM users {SCRAM_USERS} as admin at {sasl_bootstrap}: {last}")


def _check_scram_users(admin: Any) -> None:
    """DescribeUserScramCredentials lists the new credentials (mechanism and iterations)."""
    for user, f in admin.describe_user_scram_credentials(list(SCRAM_USERS), request_timeout=30).items():
        desc = f.result(timeout=30)
        infos = [(i.mechanism.name, i.iterations) for i in desc.scram_credential_infos]
        want = (SCRAM_MECHANISM.replace("-", "_"), SCRAM_ITERATIONS)
        if want not in infos:
            raise RuntimeError(f"DescribeUserScramCredentials for {user} gives {infos}, not {want}")


class Acls:
    """ACLs a scenario creates (CreateAcls, as admin), removed again (DeleteAcls) at its end."""

    def __init__(self, sasl_bootstrap: str, plaintext_bootstrap: str) -> None:
        self.admin = admin_client(sasl_bootstrap)
        self.plaintext_bootstrap = plaintext_bootstrap
        self.created: list[Any] = []

    def add(self, principal: str, operation: str, resource: str, name: str, *, pattern: str = "LITERAL",
            permission: str = "ALLOW", host: str = "*") -> None:
        """operation: READ, WRITE, ALTER, DESCRIBE, ...; resource: TOPIC, GROUP, CLUSTER;
        pattern: LITERAL or PREFIXED; permission: ALLOW or DENY."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        b = AclBinding(ResourceType[resource], name, ResourcePatternType[pattern], principal, host,
                       AclOperation[operation], AclPermissionType[permission])
        try:
            for f in self.admin.create_acls([b], request_timeout=30).values():
                f.result(timeout=30)
        except KafkaException as e:
            _raise(e)
        self.created.append(b)
        self._wait_described(b)

    def _wait_described(self, b: Any, timeout: float = 20.0) -> None:
        """Until DescribeAcls lists the new binding: ACLs reach the brokers' authorizers asynchronously
        (in Kafka as in a pykbroker cluster), and a scenario must not race them."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AclBindingFilter

        flt = AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                               b.permission_type)
        deadline = time.monotonic() + timeout
        last: object = None
        for _ in range(1000):
            try:
                found = self.admin.describe_acls(flt, request_timeout=30).result(timeout=30)
                if any(x == b for x in found):
                    self._wait_every_broker(b, deadline)
                    return
                last = found
            except KafkaException as e:
                last = e
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        raise TimeoutError(f"DescribeAcls does not list {b} after {timeout}s (last answer: {last})")

    def _wait_every_broker(self, b: Any, deadline: float) -> None:
        """Until each broker's own DescribeAcls (over PLAINTEXT, whose ANONYMOUS principal is a super user)
        matches the binding: in a cluster every broker's authorizer learns new ACLs on its own."""
        from compat import wire

        codes = (RESOURCE_TYPES[b.restype.name], PATTERN_TYPES[b.resource_pattern_type.name],
                 OPERATIONS[b.operation.name], PERMISSIONS[b.permission_type.name])
        pending = wire.broker_addresses(self.plaintext_bootstrap)
        last: object = None
        for _ in range(1000):
            for broker, addr in list(pending.items()):
                try:
                    if wire.describe_acls(addr, codes[0], b.name, codes[1], b.principal, b.host, codes[2],
                                          codes[3]) > 0:
                        del pending[broker]
                except (OSError, ConnectionError, RuntimeError) as e:
                    last = e
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if pending:
            raise TimeoutError(f"brokers {sorted(pending)} do not list {b} in DescribeAcls ({last})")

    def remove_all(self) -> None:
        """Delete every ACL this object created (each as an exact filter)."""
        from confluent_kafka.admin import AclBindingFilter

        if not self.created:
            return
        filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host,
                                    b.operation, b.permission_type) for b in self.created]
        errors = []
        for f in self.admin.delete_acls(filters, request_timeout=30).values():
            try:
                f.result(timeout=30)
            except Exception as e:
                errors.append(e)
        self.created.clear()
        if errors:
            raise ClientError("CLIENT_ERROR", f"deleting ACLs failed: {errors}")
