"""A seeded random fault schedule: the same seed gives the same faults at the same times on the same targets.

One fault at a time, each followed by a quiet spell, so that with 3 brokers, replication factor 3 and
min.insync.replicas=2 the cluster can always make progress once a fault ends; what is checked is that
nothing acknowledged is lost or reordered while it cannot.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

# kill_restart: SIGKILL and start again at once (the old ZooKeeper session still holds the registration);
# kill_wait_restart: SIGKILL, down for `hold` seconds, then start; pause_broker: SIGSTOP for `hold`, SIGCONT;
# pause_zookeeper: SIGSTOP ZooKeeper for `hold` (sessions may expire); graceful_restart: SIGTERM (controlled
# shutdown) and start; preferred_election: ElectLeaders (preferred) for every partition during the load;
# clock_jump: step the broker's wall clock forward or back (30 s to 10 min) for `hold`, then back to real time;
# disk_full: fill the broker's log dir (a tmpfs), empty it after `hold` and start the broker if it stopped
# (tests/nemesis/host.py).
# Network partitions, each held for `hold` then healed (silent drops; tests/support/netns.py):
# partition_isolate: the target broker reaches nobody (brokers, ZooKeeper, clients) and nobody reaches it;
# partition_majority: the target cut from the other two brokers and ZooKeeper (the majority side), clients
# still reach it; partition_bridge: the other two brokers cut from each other, the target reaching both;
# partition_zookeeper: the target cut from ZooKeeper only; partition_clients: the clients cut from the target.
PARTITION_FAULTS = ("partition_isolate", "partition_majority", "partition_bridge", "partition_zookeeper",
                    "partition_clients")
FAULTS = ("kill_restart", "kill_wait_restart", "pause_broker", "pause_zookeeper", "graceful_restart",
          "preferred_election", "clock_jump", "disk_full", *PARTITION_FAULTS)


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the workload started
    kind: str
    target: int  # a broker id (0 for ZooKeeper and cluster-wide faults)
    hold: float  # seconds the fault lasts, where it lasts

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def schedule(seed: int, duration: float, brokers: list[int], *, first: float = 5.0,
             quiet: tuple[float, float] = (6.0, 12.0), hold: tuple[float, float] = (1.0, 8.0)) -> list[Fault]:
    """Faults from ``first`` until 10 s before ``duration`` (the last seconds let the cluster heal)."""
    rng = random.Random(seed)
    out: list[Fault] = []
    t = first
    for _ in range(10_000):  # bounded: each step moves t forward by at least quiet[0]
        if t >= duration - 10.0:
            break
        kind = rng.choice(FAULTS)
        target = 0 if kind in ("pause_zookeeper", "preferred_election") else rng.choice(brokers)
        h = round(rng.uniform(*hold), 2)
        if kind == "pause_zookeeper":
            h = min(h, 4.0)  # below the brokers' session timeout (6 s) half the time, above it never
        out.append(Fault(round(t, 2), kind, target, h))
        t += h + rng.uniform(*quiet)
    return out
