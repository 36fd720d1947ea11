"""The advertised ApiVersions table against Kafka 3.9's, with every difference explained in the README.

Kafka 3.9's table is computed from the shared message schemas (``../shared/reference/kafka/message``
beside the repository): what a 3.9 broker answers to clients is every API whose ``listeners`` include
``broker``, each with its ``validVersions``, less the latest version where ``latestVersionUnstable``
is set (an API left with no stable version is not advertised).  Ours is the dispatcher's
``API_TABLE``.  Each difference must be a row of the README table "API differences from Kafka 3.9"
(API, Kafka 3.9 versions, ours, reason) and each row must be a real difference, so the table and
the code cannot drift apart.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pykbroker.server.dispatcher import API_TABLE

REPO = Path(__file__).resolve().parents[2]
SCHEMAS = REPO.parent / "shared" / "reference" / "kafka" / "message"
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


def kafka_39_table() -> dict[int, tuple[str, tuple[int, int]]]:
    """api key -> (name, (min, max)) as a Kafka 3.9 broker advertises to clients."""
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
    return {k: (s.min_version, s.max_version) for k, s in API_TABLE.items()}


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
    kafka = kafka_39_table()
    mine = ours()
    out = {}
    for key in sorted(set(kafka) | set(mine)):
        k = kafka[key][1] if key in kafka else None
        o = mine.get(key)
        if k != o:
            name = kafka[key][0] if key in kafka else f"api {key}"
            out[key] = (name, _fmt(k), _fmt(o))
    return out


@pytest.fixture(scope="module")
def schemas_present() -> None:
    if not SCHEMAS.is_dir():  # the shared reference is part of the checkout layout, not optional
        raise AssertionError(f"Kafka's message schemas are missing: {SCHEMAS}")


def test_kafka_39_table_is_what_a_39_broker_answers(schemas_present: None) -> None:
    """Spot checks of the computed table against Kafka 3.9's documented ApiVersions answer."""
    kafka = kafka_39_table()
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


def test_every_difference_from_kafka_39_is_explained_in_the_readme(schemas_present: None) -> None:
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


def test_we_advertise_nothing_kafka_39_does_not_answer(schemas_present: None) -> None:
    """A key outside Kafka 3.9's client table would be a broker-internal API exposed to clients."""
    extra = sorted(set(ours()) - set(kafka_39_table()))
    assert not extra, f"advertised but not answered by a Kafka 3.9 broker: {extra}"
