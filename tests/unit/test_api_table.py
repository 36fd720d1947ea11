"""The advertised ApiVersions table against Kafka 3.9's, with every difference explained in the README.

Kafka 3.9's table, ``KAFKA_39_TABLE`` below, is what a 3.9 broker answers to clients: every API whose
schema's ``listeners`` include ``broker``, each with its ``validVersions``, less the latest version
where ``latestVersionUnstable`` is set (an API left with no stable version is not advertised).  It is
kept here as facts so the comparison runs in any clone; where Kafka's message schemas are at hand
(``../shared/reference/kafka/message`` beside the repository, as in CI, or ``PYKB_KAFKA_SCHEMAS``),
a test recomputes it from them and fails if the two differ.  Ours is the dispatcher's
``API_TABLE``.  Each difference must be a row of the README table "API differences from Kafka 3.9"
(API, Kafka 3.9 versions, ours, reason) and each row must be a real difference, so the table and
the code cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from pykbroker.server.dispatcher import API_TABLE, INTER_BROKER_APIS

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = Path(os.environ.get("PYKB_KAFKA_SCHEMAS") or REPO.parent / "shared" / "reference" / "kafka" / "message")
README = REPO / "README.md"
SECTION = "API differences from Kafka 3.9"
NONE = "none"


def _versions(spec: str) -> tuple[int, int]:
    lo, _, hi = spec.partition("-")
    return int(lo), int(hi or lo)


def _load_schema(path: Path) -> dict[str, object]:
    text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("//"))
    data = json.loads(text)
    assert isinstance(data, dict)
    return data


KAFKA_39_TABLE: dict[int, tuple[str, tuple[int, int]]] = {
    0: ("Produce", (0, 11)),
    1: ("Fetch", (0, 17)),
    2: ("ListOffsets", (0, 10)),
    3: ("Metadata", (0, 12)),
    8: ("OffsetCommit", (0, 9)),
    9: ("OffsetFetch", (0, 9)),
    10: ("FindCoordinator", (0, 6)),
    11: ("JoinGroup", (0, 9)),
    12: ("Heartbeat", (0, 4)),
    13: ("LeaveGroup", (0, 5)),
    14: ("SyncGroup", (0, 5)),
    15: ("DescribeGroups", (0, 5)),
    16: ("ListGroups", (0, 5)),
    17: ("SaslHandshake", (0, 1)),
    18: ("ApiVersions", (0, 4)),
    19: ("CreateTopics", (0, 7)),
    20: ("DeleteTopics", (0, 6)),
    21: ("DeleteRecords", (0, 2)),
    22: ("InitProducerId", (0, 5)),
    23: ("OffsetForLeaderEpoch", (0, 4)),
    24: ("AddPartitionsToTxn", (0, 5)),
    25: ("AddOffsetsToTxn", (0, 4)),
    26: ("EndTxn", (0, 4)),
    27: ("WriteTxnMarkers", (0, 1)),
    28: ("TxnOffsetCommit", (0, 4)),
    29: ("DescribeAcls", (0, 3)),
    30: ("CreateAcls", (0, 3)),
    31: ("DeleteAcls", (0, 3)),
    32: ("DescribeConfigs", (0, 4)),
    33: ("AlterConfigs", (0, 2)),
    34: ("AlterReplicaLogDirs", (0, 2)),
    35: ("DescribeLogDirs", (0, 4)),
    36: ("SaslAuthenticate", (0, 2)),
    37: ("CreatePartitions", (0, 3)),
    38: ("CreateDelegationToken", (0, 3)),
    39: ("RenewDelegationToken", (0, 2)),
    40: ("ExpireDelegationToken", (0, 2)),
    41: ("DescribeDelegationToken", (0, 3)),
    42: ("DeleteGroups", (0, 2)),
    43: ("ElectLeaders", (0, 2)),
    44: ("IncrementalAlterConfigs", (0, 1)),
    45: ("AlterPartitionReassignments", (0, 0)),
    46: ("ListPartitionReassignments", (0, 0)),
    47: ("OffsetDelete", (0, 0)),
    48: ("DescribeClientQuotas", (0, 1)),
    49: ("AlterClientQuotas", (0, 1)),
    50: ("DescribeUserScramCredentials", (0, 0)),
    51: ("AlterUserScramCredentials", (0, 0)),
    55: ("DescribeQuorum", (0, 2)),
    57: ("UpdateFeatures", (0, 2)),
    60: ("DescribeCluster", (0, 1)),
    61: ("DescribeProducers", (0, 0)),
    64: ("UnregisterBroker", (0, 0)),
    65: ("DescribeTransactions", (0, 0)),
    66: ("ListTransactions", (0, 1)),
    68: ("ConsumerGroupHeartbeat", (0, 0)),
    69: ("ConsumerGroupDescribe", (0, 0)),
    71: ("GetTelemetrySubscriptions", (0, 0)),
    72: ("PushTelemetry", (0, 0)),
    74: ("ListClientMetricsResources", (0, 0)),
    75: ("DescribeTopicPartitions", (0, 0)),
    80: ("AddRaftVoter", (0, 0)),
    81: ("RemoveRaftVoter", (0, 0)),
}


def kafka_39_table_from_schemas() -> dict[int, tuple[str, tuple[int, int]]]:
    """api key -> (name, (min, max)) as a Kafka 3.9 broker advertises to clients, from the schemas."""
    table: dict[int, tuple[str, tuple[int, int]]] = {}
    for path in sorted(SCHEMAS.glob("*Request.json")):
        data = _load_schema(path)
        listeners = data.get("listeners") or []
        assert isinstance(listeners, list)
        if "broker" not in listeners:
            continue
        lo, hi = _versions(str(data["validVersions"]))
        if data.get("latestVersionUnstable"):
            hi -= 1
        if hi < lo:
            continue
        name = str(data["name"]).removesuffix("Request")
        table[int(str(data["apiKey"]))] = (name, (lo, hi))
    return table


def ours() -> dict[int, tuple[int, int]]:
    """What ApiVersions can advertise (the inter-broker share coordinator APIs never are)."""
    return {k: (s.min_version, s.max_version) for k, s in API_TABLE.items() if k not in INTER_BROKER_APIS}


def _fmt(v: tuple[int, int] | None) -> str:
    if v is None:
        return NONE
    return str(v[0]) if v[0] == v[1] else f"{v[0]}-{v[1]}"


def readme_rows() -> dict[int, tuple[str, str, str]]:
    """api key -> (Kafka 3.9 versions, ours, reason) from the README table."""
    lines = README.read_text().splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.lstrip("#").strip() == SECTION)
    except StopIteration:
        raise AssertionError(f"README.md has no section {SECTION!r}") from None
    rows: dict[int, tuple[str, str, str]] = {}
    in_table = False
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if not line.startswith("|"):
            if in_table:
                break
            continue
        in_table = True
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or set(cells[0]) <= set("-: ") or cells[0] == "API":
            continue
        m = re.search(r"\((\d+)\)", cells[0])
        assert m, f"README {SECTION}: cannot find the API key in {cells[0]!r} (write it as 'Name (key)')"
        key = int(m.group(1))
        assert key not in rows, f"README {SECTION}: API key {key} is listed twice"
        rows[key] = (cells[1].strip("`"), cells[2].strip("`"), cells[3])
    return rows


def differences() -> dict[int, tuple[str, str, str]]:
    kafka = KAFKA_39_TABLE
    mine = ours()
    out = {}
    for key in sorted(set(kafka) | set(mine)):
        k = kafka[key][1] if key in kafka else None
        o = mine.get(key)
        if k != o:
            name = kafka[key][0] if key in kafka else f"api {key}"
            out[key] = (name, _fmt(k), _fmt(o))
    return out


def test_the_kafka_39_table_is_the_one_the_schemas_give() -> None:
    if not SCHEMAS.is_dir():
        pytest.skip(f"Kafka's message schemas are not beside this checkout ({SCHEMAS}); CI has them")
    assert kafka_39_table_from_schemas() == KAFKA_39_TABLE


def test_kafka_39_table_is_what_a_39_broker_answers() -> None:
    """Spot checks of the table against Kafka 3.9's documented ApiVersions answer."""
    kafka = KAFKA_39_TABLE
    assert kafka[0] == ("Produce", (0, 11))
    assert kafka[1] == ("Fetch", (0, 17))
    assert kafka[18][1] == (0, 4)
    assert kafka[26][1] == (0, 4), "EndTxn v5 is unstable in 3.9"
    assert kafka[68][1] == (0, 0), "ConsumerGroupHeartbeat v1 is unstable in 3.9"
    assert 74 in kafka and kafka[74][1] == (0, 0), "ListClientMetricsResources"
    for controller_only in (4, 5, 6, 7, 52, 56, 58, 62, 67, 73):
        assert controller_only not in kafka, f"api {controller_only} is not answered to clients"
    for share_group in (76, 77, 78, 79):
        assert share_group not in kafka, "share groups have no stable version in 3.9"


def test_every_difference_from_kafka_39_is_explained_in_the_readme() -> None:
    diffs = differences()
    rows = readme_rows()
    problems = []
    for key, (name, kafka, mine) in diffs.items():
        row = rows.get(key)
        if row is None:
            problems.append(f"missing row: | {name} ({key}) | {kafka} | {mine} | <reason> |")
        elif (row[0], row[1]) != (kafka, mine):
            problems.append(f"{name} ({key}): README says Kafka 3.9 {row[0]!r}, ours {row[1]!r}; "
                            f"actually {kafka!r} and {mine!r}")
        elif not row[2]:
            problems.append(f"{name} ({key}): the README row gives no reason")
    for key in sorted(set(rows) - set(diffs)):
        problems.append(f"README row for API key {key} is no longer a difference: remove it")
    assert not problems, f"README '{SECTION}' disagrees with the code:\n" + "\n".join(problems)


# Client APIs that Kafka 4.x answers and 3.9 does not: the share group APIs (KIP-932), advertised only with
# group.share.enable=true (their README rows say so).
KAFKA_4_CLIENT_APIS = frozenset({76, 77, 78, 79, 90, 91, 92})


def test_we_advertise_nothing_kafka_39_does_not_answer() -> None:
    """A key outside Kafka 3.9's client table would be a broker-internal API exposed to clients."""
    extra = sorted(set(ours()) - set(KAFKA_39_TABLE) - KAFKA_4_CLIENT_APIS)
    assert not extra, f"advertised but not answered by a Kafka 3.9 broker: {extra}"
