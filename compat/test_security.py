"""Security: SASL (PLAIN, SCRAM-SHA-512) on the secured listener and ACLs (Kafka's StandardAuthorizer).

Every scenario runs with each client authenticating as a user over SASL_PLAINTEXT (compat/security.py);
the ACLs it needs are created for it alone (unique topic and group names) through confluent-kafka's
AdminClient as the super user admin, and deleted at its end. Topics are created over PLAINTEXT, whose
principal (ANONYMOUS) is a super user of the suite's brokers. Only Kafka's documented behaviour is
asserted: a refused operation fails with TOPIC_AUTHORIZATION_FAILED or GROUP_AUTHORIZATION_FAILED, a
wrong password fails authentication, DENY wins over ALLOW, a prefixed ACL covers the names under its
prefix, a super user needs no ACL, and Metadata leaves out the topics the user may not DESCRIBE.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from compat import scenario as s
from compat import security
from compat.check import expect_error, text_msgs
from compat.clients import base, make_client
from compat.clients.base import Client, ClientError, Member, Msg, NotSupportedByClient, wait_until
from compat.cluster import ClusterInfo
from compat.conftest import get_secure_client
from compat.scenario import NS_BROKER, NS_CLUSTER

FAMILY = "security"
ACL_APIS = (29, 30, 31)                 # DescribeAcls, CreateAcls, DeleteAcls
SASL_APIS = (17, 36)                    # SaslHandshake, SaslAuthenticate
SCRAM_APIS = (51,)                      # AlterUserScramCredentials (the SCRAM users are made with it)
MECHANISMS = ["PLAIN", security.SCRAM_MECHANISM]
CONSUME_TIMEOUT = 45.0


def identity_for(client: Client, cluster: ClusterInfo, user: str, mechanism: str,
                 password: str | None = None) -> base.Sasl:
    """The identity, once the broker is known to have what the mechanism needs: SCRAM users are created
    with AlterUserScramCredentials, so a broker without it cannot serve the SCRAM scenarios."""
    if mechanism.startswith("SCRAM") and SCRAM_APIS[0] not in cluster.api_versions:
        pytest.skip(f"{NS_BROKER}: ApiVersions: AlterUserScramCredentials({SCRAM_APIS[0]}) is not advertised")
    return security.identity(user, mechanism, password)


def unique(tag: str) -> str:
    return f"compat-sec-{tag}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def acls(cluster: ClusterInfo) -> Iterator[security.Acls]:
    if cluster.sasl_bootstrap is None:
        pytest.skip(f"{NS_CLUSTER}: no SASL_PLAINTEXT listener (give --sasl-bootstrap with --bootstrap)")
    a = security.Acls(cluster.sasl_bootstrap, cluster.bootstrap)
    yield a
    a.remove_all()


@pytest.fixture
def topics(new_topic: Any) -> Callable[..., str]:
    """Factory: the suite's new_topic, with the name chosen by the scenario (prefix ACLs need it)."""
    return lambda name, partitions=1: new_topic(partitions, name=name)


def as_user(client: Client, cluster: ClusterInfo, user: str, mechanism: str = "PLAIN") -> Client:
    return get_secure_client(client.name, cluster, security.identity(user, mechanism))


def _norm(text: str) -> str:
    return re.sub(r"[^a-z]", "", text.lower())


def consume_in_group(client: Client, group: str, topic: str, count: int) -> list[base.Record]:
    """Records of ``topic`` read by one member of ``group`` (a member that fails ends the wait at once)."""
    member = client.start_member(group, [topic])
    try:
        def enough() -> bool:
            if member.failed:
                raise AssertionError(f"the member failed: {member.error}")
            return len(member.records()) >= count

        wait_until(enough, CONSUME_TIMEOUT, what=f"{count} records of {topic} in group {group} "
                                                 f"(member error: {member.error})")
        return member.records()
    finally:
        member.close()


def assert_values(sent: list[Msg], got: list[base.Record]) -> None:
    assert sorted(r.value or b"" for r in got) == sorted(m.value or b"" for m in sent)


def produce_consume(client: Client, topic: str, group: str, tag: str) -> None:
    msgs = text_msgs(5, prefix=tag, headers=False)
    client.produce(topic, msgs)
    assert_values(msgs, consume_in_group(client, group, topic, len(msgs)))


def wait_member_error(member: Member, kind: str, timeout: float = 30.0) -> str:
    """The member's error once it names ``kind`` (e.g. "group authorization"), in any client's spelling:
    GROUP_AUTHORIZATION_FAILED, "Group authorization failed", GroupAuthorizationException, ..."""
    want = _norm(kind)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        err = member.error or ""
        if want in _norm(err):
            return err
        if member.failed:
            break
        if member.records():
            raise AssertionError(f"the member read records though it should not be allowed: {member.records()[:3]}")
        time.sleep(0.1)
    raise AssertionError(f"expected the member to report {kind}, its error is {member.error!r}")


# --- authentication ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mechanism", MECHANISMS)
@s.scenario("security.sasl-produce-consume", FAMILY, needs=(base.GROUPS,), apis=(0, 1, 3, *ACL_APIS, *SASL_APIS))
def test_sasl_produce_consume(client: Client, cluster: ClusterInfo, acls: security.Acls, topics: Any,
                              mechanism: str) -> None:
    """A user authenticated with PLAIN or SCRAM-SHA-512, with WRITE and READ on the topic and READ on the
    group, produces and consumes."""
    user = get_secure_client(client.name, cluster, identity_for(client, cluster, "alice", mechanism))
    topic, group = topics(unique("pc")), unique("pc-group")
    acls.add("User:alice", "WRITE", "TOPIC", topic)
    acls.add("User:alice", "READ", "TOPIC", topic)
    acls.add("User:alice", "READ", "GROUP", group)
    produce_consume(user, topic, group, "sasl")


def _is_auth_failure(e: BaseException) -> bool:
    text = _norm(f"{getattr(e, 'name', '')} {e} {e!r}")
    return "authentication" in text or "authenticat" in text


@pytest.mark.parametrize("mechanism", MECHANISMS)
@s.scenario("security.wrong-password", FAMILY, apis=SASL_APIS, consumes=False)
def test_wrong_password(client: Client, cluster: ClusterInfo, mechanism: str) -> None:
    """A wrong password: the broker refuses the authentication and the client reports it
    (SASL_AUTHENTICATION_FAILED, in the client's spelling), instead of getting an answer."""
    if cluster.sasl_bootstrap is None:
        pytest.skip(f"{NS_CLUSTER}: no SASL_PLAINTEXT listener (give --sasl-bootstrap with --bootstrap)")
    wrong = make_client(client.name, cluster.sasl_bootstrap,
                        identity_for(client, cluster, "alice", mechanism, "not-" + security.PASSWORDS["alice"]))
    try:
        try:
            wrong.authenticate()
        except NotSupportedByClient:
            raise
        except Exception as e:  # any client's own exception type, as long as it says why
            assert _is_auth_failure(e), f"expected an authentication failure, got {type(e).__name__}: {e}"
            return
        raise AssertionError("metadata with a wrong password succeeded")
    finally:
        wrong.close()


# --- authorization ----------------------------------------------------------------------------------

@s.scenario("security.produce-without-write", FAMILY, apis=(0, 3, *ACL_APIS, *SASL_APIS), consumes=False)
def test_produce_without_write(client: Client, cluster: ClusterInfo, acls: security.Acls, topics: Any) -> None:
    """READ (which implies DESCRIBE) but no WRITE on the topic: producing fails with
    TOPIC_AUTHORIZATION_FAILED."""
    user = as_user(client, cluster, "alice")
    topic = topics(unique("no-write"))
    acls.add("User:alice", "READ", "TOPIC", topic)
    expect_error("TOPIC_AUTHORIZATION_FAILED", user.produce, topic, text_msgs(2, headers=False), timeout=20.0)


@s.scenario("security.consume-without-group-read", FAMILY, needs=(base.GROUPS,),
            apis=(10, 11, *ACL_APIS, *SASL_APIS), consumes=False)
def test_consume_without_group_read(client: Client, cluster: ClusterInfo, acls: security.Acls,
                                    topics: Any, helper: Client) -> None:
    """READ on the topic but nothing on the group: the consumer's group requests fail with
    GROUP_AUTHORIZATION_FAILED, and it reads nothing."""
    user = as_user(client, cluster, "alice")
    topic, group = topics(unique("no-group")), unique("no-group-group")
    helper.produce(topic, text_msgs(2, headers=False))
    acls.add("User:alice", "READ", "TOPIC", topic)
    member = user.start_member(group, [topic])
    try:
        wait_member_error(member, "group authorization")
    finally:
        try:
            member.close()
        except Exception:
            pass


@s.scenario("security.admin-without-alter", FAMILY, needs=(base.ADMIN,), apis=(37, *ACL_APIS, *SASL_APIS),
            consumes=False)
def test_admin_without_alter(client: Client, cluster: ClusterInfo, acls: security.Acls, topics: Any,
                             helper: Client) -> None:
    """DESCRIBE but no ALTER on the topic: CreatePartitions fails with TOPIC_AUTHORIZATION_FAILED and the
    topic keeps its partitions."""
    user = as_user(client, cluster, "alice")
    topic = topics(unique("no-alter"))
    acls.add("User:alice", "DESCRIBE", "TOPIC", topic)
    expect_error("TOPIC_AUTHORIZATION_FAILED", user.create_partitions, topic, 2)
    assert helper.describe_topic(topic) == 1


@s.scenario("security.prefixed-acls", FAMILY, needs=(base.GROUPS,), apis=(0, 1, 3, *ACL_APIS, *SASL_APIS))
def test_prefixed_acls(client: Client, cluster: ClusterInfo, acls: security.Acls, topics: Any) -> None:
    """WRITE and READ on a topic prefix and READ on a group prefix grant every topic and group under
    them, and nothing else."""
    user = as_user(client, cluster, "alice")
    prefix = unique("prefix") + "."
    acls.add("User:alice", "WRITE", "TOPIC", prefix, pattern="PREFIXED")
    acls.add("User:alice", "READ", "TOPIC", prefix, pattern="PREFIXED")
    acls.add("User:alice", "READ", "GROUP", prefix, pattern="PREFIXED")
    inside = topics(prefix + "inside")
    outside = topics(prefix.rstrip(".") + "-outside")     # shares all but the prefix's last character
    produce_consume(user, inside, prefix + "group", "prefixed")
    expect_error("TOPIC_AUTHORIZATION_FAILED", user.produce, outside, text_msgs(1, headers=False), timeout=20.0)


@s.scenario("security.deny-overrides-allow", FAMILY, apis=(0, 3, *ACL_APIS, *SASL_APIS), consumes=False)
def test_deny_overrides_allow(client: Client, cluster: ClusterInfo, acls: security.Acls, topics: Any) -> None:
    """ALLOW ALL on the topic and DENY WRITE on its prefix: the DENY wins, producing fails with
    TOPIC_AUTHORIZATION_FAILED."""
    user = as_user(client, cluster, "alice")
    prefix = unique("deny") + "."
    topic = topics(prefix + "topic")
    acls.add("User:alice", "ALL", "TOPIC", topic)
    acls.add("User:alice", "WRITE", "TOPIC", prefix, pattern="PREFIXED", permission="DENY")
    expect_error("TOPIC_AUTHORIZATION_FAILED", user.produce, topic, text_msgs(2, headers=False), timeout=20.0)


@s.scenario("security.super-user", FAMILY, needs=(base.GROUPS,), apis=(0, 1, 3, *ACL_APIS, *SASL_APIS))
def test_super_user(client: Client, cluster: ClusterInfo, acls: security.Acls, topics: Any,
                    helper: Client) -> None:
    """admin (in super.users) is allowed everything whatever the ACLs say, a DENY ALL on its topic and
    group included: it produces, consumes in a group and, where the client has an admin API, adds
    partitions."""
    admin = as_user(client, cluster, "admin")
    topic, group = topics(unique("super")), unique("super-group")
    acls.add("User:admin", "ALL", "TOPIC", topic, permission="DENY")
    acls.add("User:admin", "ALL", "GROUP", group, permission="DENY")
    produce_consume(admin, topic, group, "super")
    if base.ADMIN in client.caps:
        admin.create_partitions(topic, 2)
        wait_until(lambda: helper.describe_topic(topic) == 2, 20, what=f"{topic} to have 2 partitions")


@s.scenario("security.metadata-hides-topics", FAMILY, apis=(3, *ACL_APIS, *SASL_APIS), consumes=False)
def test_metadata_hides_topics(client: Client, cluster: ClusterInfo, acls: security.Acls, topics: Any) -> None:
    """Metadata for all topics lists the topic the user may DESCRIBE and leaves out the one it may not."""
    user = as_user(client, cluster, "alice")
    shown, hidden = topics(unique("shown")), topics(unique("hidden"))
    acls.add("User:alice", "DESCRIBE", "TOPIC", shown)
    try:
        names = set(user.metadata()["topics"])
    except ClientError as e:
        raise AssertionError(f"metadata as alice failed: {e}") from None
    assert shown in names, f"{shown} (DESCRIBE allowed) is missing from the metadata"
    assert hidden not in names, f"{hidden} (no ACL) is listed in the metadata"
