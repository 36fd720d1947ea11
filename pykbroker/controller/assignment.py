"""Replica assignment for new topics and partitions, as Kafka's AdminUtils.assignReplicasToBrokers.

Rack-unaware: the first replica of each partition goes round-robin over the brokers sorted by id,
starting at a random index; the other replicas follow with a shift that grows after every full
round, so that a broker's followers are spread over the other brokers. Rack-aware (every broker
has a rack): the same walk over a broker list that alternates racks, skipping a broker whose rack
already holds a replica while some rack holds none.
"""

from __future__ import annotations

import random

UNKNOWN_SERVER_ERROR = -1
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38


class AssignmentError(ValueError):
    """A topic's replicas cannot be assigned; ``error_code`` is the Kafka error a request answers."""

    error_code = UNKNOWN_SERVER_ERROR


class InvalidPartitions(AssignmentError):
    error_code = INVALID_PARTITIONS


class InvalidReplicationFactor(AssignmentError):
    error_code = INVALID_REPLICATION_FACTOR


def assign_replicas(brokers: dict[int, str | None], num_partitions: int, replication_factor: int, *,
                    fixed_start_index: int = -1, start_partition_id: int = -1,
                    rng: random.Random | None = None) -> dict[int, list[int]]:
    """Partition id -> replicas (the first is the preferred leader) for ``num_partitions`` partitions.

    ``brokers`` maps each live broker id to its rack (None: no broker.rack). ``fixed_start_index``
    (>= 0) makes the result deterministic; otherwise the start index and the initial shift come
    from ``rng``. ``start_partition_id`` numbers the first partition (additions to a topic).
    """
    if num_partitions <= 0:
        raise InvalidPartitions("Number of partitions must be larger than 0.")
    if replication_factor <= 0:
        raise InvalidReplicationFactor("Replication factor must be larger than 0.")
    if replication_factor > len(brokers):
        raise InvalidReplicationFactor(
            f"Replication factor: {replication_factor} larger than available brokers: {len(brokers)}.")
    rng = rng or random.Random()
    if all(rack is None for rack in brokers.values()):
        return _rack_unaware(num_partitions, replication_factor, sorted(brokers), fixed_start_index,
                             start_partition_id, rng)
    if any(rack is None for rack in brokers.values()):
        raise AssignmentError("Not all brokers have rack information for replica rack aware assignment.")
    racks = {b: r for b, r in brokers.items() if r is not None}
    return _rack_aware(num_partitions, replication_factor, racks, fixed_start_index, start_partition_id, rng)


def assign_new_partitions(brokers: dict[int, str | None], existing: dict[int, list[int]], total: int, *,
                          rng: random.Random | None = None) -> dict[int, list[int]]:
    """Replicas of the partitions added to a topic that has ``existing`` (CreatePartitions).

    As Kafka: the replication factor of partition 0, continuing the round-robin from the index
    of partition 0's first replica among the brokers sorted by id.
    """
    if total <= len(existing):
        raise InvalidPartitions(f"Topic currently has {len(existing)} partitions, {total} would not be an increase.")
    first = existing[0] if 0 in existing else next(iter(existing.values()))
    ids = sorted(brokers)
    start = next((i for i, b in enumerate(ids) if b >= first[0]), 0)
    return assign_replicas(brokers, total - len(existing), len(first), fixed_start_index=start,
                           start_partition_id=len(existing), rng=rng)


def _replica_index(first: int, shift: int, replica: int, n: int) -> int:
    return (first + 1 + (shift + replica) % (n - 1)) % n


def _rack_unaware(num_partitions: int, rf: int, ids: list[int], fixed_start: int, start_partition: int,
                  rng: random.Random) -> dict[int, list[int]]:
    n = len(ids)
    start = fixed_start if fixed_start >= 0 else rng.randrange(n)
    shift = fixed_start if fixed_start >= 0 else rng.randrange(n)
    partition = max(0, start_partition)
    out: dict[int, list[int]] = {}
    for _ in range(num_partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (partition + start) % n
        out[partition] = [ids[first]] + [ids[_replica_index(first, shift, j, n)] for j in range(rf - 1)]
        partition += 1
    return out


def rack_alternated(racks: dict[int, str]) -> list[int]:
    """Brokers taking one from each rack in turn (racks sorted by name, brokers by id)."""
    by_rack: dict[str, list[int]] = {}
    for b in sorted(racks):
        by_rack.setdefault(racks[b], []).append(b)
    queues = [by_rack[r] for r in sorted(by_rack)]
    out: list[int] = []
    for i in range(max(len(q) for q in queues)):
        out.extend(q[i] for q in queues if i < len(q))
    return out


def _rack_aware(num_partitions: int, rf: int, racks: dict[int, str], fixed_start: int, start_partition: int,
                rng: random.Random) -> dict[int, list[int]]:
    arranged = rack_alternated(racks)
    n = len(arranged)
    num_racks = len(set(racks.values()))
    start = fixed_start if fixed_start >= 0 else rng.randrange(n)
    shift = fixed_start if fixed_start >= 0 else rng.randrange(n)
    partition = max(0, start_partition)
    out: dict[int, list[int]] = {}
    for _ in range(num_partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (partition + start) % n
        leader = arranged[first]
        replicas = [leader]
        used_racks = {racks[leader]}
        used = {leader}
        k = 0
        for _ in range(rf - 1):
            # Bounded: within n steps every broker has been visited (the shift walks all n - 1 others).
            for _ in range(2 * n):
                broker = arranged[_replica_index(first, shift * num_racks, k, n)]
                k += 1
                rack = racks[broker]
                if (rack not in used_racks or len(used_racks) == num_racks) and (broker not in used or len(used) == n):
                    replicas.append(broker)
                    used_racks.add(rack)
                    used.add(broker)
                    break
        out[partition] = replicas
        partition += 1
    return out
