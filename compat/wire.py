"""The little of the Kafka protocol the suite speaks itself: ApiVersions, to learn what a cluster supports."""

from __future__ import annotations

import socket
import struct

API_NAMES: dict[int, str] = {
    0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 4: "LeaderAndIsr", 5: "StopReplica",
    6: "UpdateMetadata", 7: "ControlledShutdown", 8: "OffsetCommit", 9: "OffsetFetch",
    10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat", 13: "LeaveGroup", 14: "SyncGroup",
    15: "DescribeGroups", 16: "ListGroups", 17: "SaslHandshake", 18: "ApiVersions", 19: "CreateTopics",
    20: "DeleteTopics", 21: "DeleteRecords", 22: "InitProducerId", 23: "OffsetForLeaderEpoch",
    24: "AddPartitionsToTxn", 25: "AddOffsetsToTxn", 26: "EndTxn", 27: "WriteTxnMarkers",
    28: "TxnOffsetCommit", 29: "DescribeAcls", 30: "CreateAcls", 31: "DeleteAcls", 32: "DescribeConfigs",
    33: "AlterConfigs", 34: "AlterReplicaLogDirs", 35: "DescribeLogDirs", 36: "SaslAuthenticate",
    37: "CreatePartitions", 38: "CreateDelegationToken", 39: "RenewDelegationToken",
    40: "ExpireDelegationToken", 41: "DescribeDelegationToken", 42: "DeleteGroups", 43: "ElectLeaders",
    44: "IncrementalAlterConfigs", 45: "AlterPartitionReassignments", 46: "ListPartitionReassignments",
    47: "OffsetDelete", 48: "DescribeClientQuotas", 49: "AlterClientQuotas",
    50: "DescribeUserScramCredentials", 51: "AlterUserScramCredentials", 55: "DescribeQuorum",
    57: "UpdateFeatures", 60: "DescribeCluster", 61: "DescribeProducers", 64: "UnregisterBroker",
    65: "DescribeTransactions", 66: "ListTransactions", 67: "AllocateProducerIds",
    68: "ConsumerGroupHeartbeat", 69: "ConsumerGroupDescribe", 71: "GetTelemetrySubscriptions",
    72: "PushTelemetry", 74: "ListClientMetricsResources", 75: "DescribeTopicPartitions",
    76: "ShareGroupHeartbeat", 77: "ShareGroupDescribe", 78: "ShareFetch", 79: "ShareAcknowledge",
}


def api_name(key: int) -> str:
    return API_NAMES.get(key, f"ApiKey{key}")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


def api_versions(bootstrap: str, timeout: float = 10.0) -> dict[int, tuple[int, int]]:
    """ApiVersions v0 against the first reachable bootstrap address: {api_key: (min, max)}."""
    last: Exception | None = None
    for addr in bootstrap.split(","):
        host, _, port = addr.strip().rpartition(":")
        client_id = b"compat-probe"
        req = struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as s:
                s.settimeout(timeout)
                s.sendall(struct.pack(">i", len(req)) + req)
                (size,) = struct.unpack(">i", _recv_exact(s, 4))
                body = _recv_exact(s, size)
        except (OSError, ConnectionError) as e:
            last = e
            continue
        corr, err, n = struct.unpack_from(">ihi", body, 0)
        if corr != 7 or err != 0:
            raise RuntimeError(f"ApiVersions from {addr}: correlation {corr}, error {err}")
        out = {}
        for i in range(n):
            k, lo, hi = struct.unpack_from(">hhh", body, 10 + 6 * i)
            out[k] = (lo, hi)
        return out
    raise ConnectionError(f"no broker answered ApiVersions at {bootstrap}: {last}")


def _request(bootstrap: str, key: int, version: int, body: bytes, flexible: bool, timeout: float) -> bytes:
    """One request to the first reachable bootstrap address; the response body after its header."""
    client_id = b"compat-probe"
    header = struct.pack(">hhih", key, version, 7, len(client_id)) + client_id + (b"\x00" if flexible else b"")
    req = header + body
    last: Exception | None = None
    for addr in bootstrap.split(","):
        host, _, port = addr.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as s:
                s.settimeout(timeout)
                s.sendall(struct.pack(">i", len(req)) + req)
                (size,) = struct.unpack(">i", _recv_exact(s, 4))
                resp = _recv_exact(s, size)
        except (OSError, ConnectionError) as e:
            last = e
            continue
        (corr,) = struct.unpack_from(">i", resp, 0)
        if corr != 7:
            raise RuntimeError(f"{API_NAMES.get(key, key)} from {addr}: correlation {corr}")
        # Response header v1 adds tagged fields (none are sent here: one zero byte).
        return resp[5:] if flexible else resp[4:]
    raise ConnectionError(f"no broker answered at {bootstrap}: {last}")


def consumer_group_heartbeat_error(bootstrap: str, timeout: float = 10.0) -> int:
    """The error code a broker answers to ConsumerGroupHeartbeat v0 for an empty group id.

    A broker with the consumer group protocol (KIP-848) enabled rejects the request itself
    (INVALID_REQUEST: the group id must not be empty), so nothing is created. One that advertises the
    API with the protocol disabled (Kafka 3.8 by default; group.coordinator.rebalance.protocols without
    "consumer") answers UNSUPPORTED_VERSION (35) before looking at it.
    """
    body = (b"\x01"                    # GroupId: "" (compact string)
            b"\x01"                    # MemberId: ""
            + struct.pack(">i", 0)     # MemberEpoch: 0 (join)
            + b"\x00\x00"              # InstanceId, RackId: null
            + struct.pack(">i", -1)    # RebalanceTimeoutMs
            + b"\x00\x00\x00"          # SubscribedTopicNames, ServerAssignor, TopicPartitions: null
            + b"\x00")                 # tagged fields
    resp = _request(bootstrap, 68, 0, body, flexible=True, timeout=timeout)
    _throttle, error = struct.unpack_from(">ih", resp, 0)
    return int(error)


def cluster_brokers(bootstrap: str, timeout: float = 10.0) -> tuple[list[int], int]:
    """The broker ids and the controller id a broker's Metadata (v1, no topics) gives."""
    resp = _request(bootstrap, 3, 1, struct.pack(">i", 0), flexible=False, timeout=timeout)
    (n,), pos = struct.unpack_from(">i", resp, 0), 4
    ids = []
    for _ in range(n):
        (node_id,) = struct.unpack_from(">i", resp, pos)
        (host_len,) = struct.unpack_from(">h", resp, pos + 4)
        pos += 6 + max(host_len, 0) + 4  # node id, host, port
        (rack_len,) = struct.unpack_from(">h", resp, pos)
        pos += 2 + max(rack_len, 0)
        ids.append(node_id)
    (controller,) = struct.unpack_from(">i", resp, pos)
    return sorted(ids), int(controller)


def broker_addresses(bootstrap: str, timeout: float = 10.0) -> dict[int, str]:
    """{broker id: "host:port"} as a broker's Metadata (v1, no topics) advertises them on this listener."""
    resp = _request(bootstrap, 3, 1, struct.pack(">i", 0), flexible=False, timeout=timeout)
    (n,), pos = struct.unpack_from(">i", resp, 0), 4
    out = {}
    for _ in range(n):
        node_id, host_len = struct.unpack_from(">ih", resp, pos)
        host = resp[pos + 6:pos + 6 + host_len].decode()
        (port,) = struct.unpack_from(">i", resp, pos + 6 + host_len)
        pos += 6 + host_len + 4
        (rack_len,) = struct.unpack_from(">h", resp, pos)
        pos += 2 + max(rack_len, 0)
        out[node_id] = f"{host}:{port}"
    return out


def topic_leaders(address: str, topic: str, timeout: float = 10.0) -> dict[int, int]:
    """{partition: leader id} of ``topic`` in the Metadata (v4, no auto-creation) of the broker at
    ``address``; empty while that broker does not know the topic (UNKNOWN_TOPIC_OR_PARTITION)."""
    name = topic.encode()
    body = struct.pack(">ih", 1, len(name)) + name + b"\x00"  # topics: [topic]; allow_auto_topic_creation false
    resp = _request(address, 3, 4, body, flexible=False, timeout=timeout)
    pos = 4  # throttle_time_ms
    (n,) = struct.unpack_from(">i", resp, pos)
    pos += 4
    for _ in range(n):
        (host_len,) = struct.unpack_from(">h", resp, pos + 4)
        pos += 6 + host_len + 4  # node id, host, port
        (rack_len,) = struct.unpack_from(">h", resp, pos)
        pos += 2 + max(rack_len, 0)
    (cluster_len,) = struct.unpack_from(">h", resp, pos)
    pos += 2 + max(cluster_len, 0) + 4  # cluster id, controller id
    (topics,) = struct.unpack_from(">i", resp, pos)
    pos += 4
    out: dict[int, int] = {}
    for _ in range(topics):
        error, tlen = struct.unpack_from(">hh", resp, pos)
        tname = resp[pos + 4:pos + 4 + tlen].decode()
        pos += 4 + tlen + 1  # error, name, is_internal
        (parts,) = struct.unpack_from(">i", resp, pos)
        pos += 4
        for _ in range(parts):
            _perr, index, leader = struct.unpack_from(">hii", resp, pos)
            pos += 10
            for _ in range(2):  # replica_nodes, isr_nodes
                (count,) = struct.unpack_from(">i", resp, pos)
                pos += 4 + 4 * max(count, 0)
            if tname == topic and error == 0:
                out[index] = leader
    return out


def _nullable(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def describe_acls(address: str, resource_type: int, name: str, pattern_type: int, principal: str, host: str,
                  operation: int, permission: int, timeout: float = 10.0) -> int:
    """How many ACL bindings one broker's DescribeAcls (v1) matches for this exact filter; raises
    RuntimeError with the error code when the broker answers one. Used to wait until a new ACL has reached
    every broker (ACLs propagate asynchronously in a cluster)."""
    body = (struct.pack(">b", resource_type) + _nullable(name) + struct.pack(">b", pattern_type)
            + _nullable(principal) + _nullable(host) + struct.pack(">bb", operation, permission))
    resp = _request(address, 29, 1, body, flexible=False, timeout=timeout)
    _throttle, error, msg_len = struct.unpack_from(">ihh", resp, 0)
    pos = 8 + max(msg_len, 0)
    if error:
        raise RuntimeError(f"DescribeAcls from {address}: error {error}")
    (n,) = struct.unpack_from(">i", resp, pos)
    pos += 4
    count = 0
    for _ in range(n):
        (name_len,) = struct.unpack_from(">h", resp, pos + 1)
        pos += 1 + 2 + name_len + 1
        (acls,) = struct.unpack_from(">i", resp, pos)
        pos += 4
        for _ in range(acls):
            (plen,) = struct.unpack_from(">h", resp, pos)
            pos += 2 + plen
            (hlen,) = struct.unpack_from(">h", resp, pos)
            pos += 2 + hlen + 2
            count += 1
    return count
