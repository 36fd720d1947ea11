"""The campaign's faults outside the broker process: a step of one broker's wall clock (``clock_jump``) and a
full log dir on one broker (``disk_full``).

Both need the broker started for them: a broker whose clock may step runs under libfaketime from its first
start (tests/support/faketime.py), and a broker whose disk may fill has its log dir on a small tmpfs mounted
before it starts (tests/support/tmpfs.py). :class:`HostFaults` does that for the brokers the schedule targets,
applies the faults and undoes them.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from tests.nemesis.schedule import Fault
from tests.support.cluster import Cluster
from tests.support.faketime import WallClock
from tests.support.tmpfs import Tmpfs

HOST_FAULTS = ("clock_jump", "disk_full")
CLOCK_STEP_S = (30.0, 600.0)  # the size of a step, either way
DISK_MIB = 256
EXIT_WAIT_S = 20.0  # how long a full broker may take to fail a write and stop


def clock_step(fault: Fault) -> float:
    """The step of a ``clock_jump`` fault, forward or back: drawn from the fault itself, so the schedule's seed
    alone determines it."""
    rng = random.Random(f"{fault.at}/{fault.target}/{fault.hold}")
    return round(rng.choice((-1.0, 1.0)) * rng.uniform(*CLOCK_STEP_S), 1)


class HostFaults:
    """Set up before the cluster starts (``with HostFaults(...), cluster:``), torn down after it stops."""

    def __init__(self, cluster: Cluster, faults: list[Fault]) -> None:
        self.cluster = cluster
        self.clocks: dict[int, WallClock] = {}
        self.disks: dict[int, Tmpfs] = {}
        for f in faults:
            broker = cluster.broker(f.target) if f.kind in HOST_FAULTS else None
            if broker is None:
                continue
            if f.kind == "clock_jump" and f.target not in self.clocks:
                self.clocks[f.target] = WallClock(cluster.base / f"faketime-{f.target}")
            elif f.kind == "disk_full" and f.target not in self.disks:
                self.disks[f.target] = Tmpfs(Path(broker.overrides["log.dirs"]), DISK_MIB)

    def __enter__(self) -> HostFaults:
        try:
            for b, clock in self.clocks.items():
                clock.attach(self.cluster.broker(b))
            for disk in self.disks.values():
                disk.mount()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for disk in self.disks.values():
            disk.unmount()

    def apply(self, fault: Fault) -> str | None:
        """Apply a host fault, waiting out its hold and undoing it; a note, or None for another kind of fault."""
        if fault.kind == "clock_jump":
            clock, step = self.clocks[fault.target], clock_step(fault)
            clock.set(step)
            time.sleep(fault.hold)
            clock.set(0.0)
            return f"wall clock stepped {step:+.1f} s, stepped back after the hold"
        if fault.kind == "disk_full":
            return self._fill(fault)
        return None

    def _fill(self, fault: Fault) -> str:
        disk, broker = self.disks[fault.target], self.cluster.broker(fault.target)
        filled = disk.fill()
        t0 = time.monotonic()
        proc = broker.proc
        for _ in range(int(EXIT_WAIT_S / 0.1) + 1):  # the next append (replication never stops) fails: ENOSPC
            if proc is None or proc.poll() is not None or time.monotonic() - t0 >= max(fault.hold, EXIT_WAIT_S):
                break
            time.sleep(0.1)
        waited = time.monotonic() - t0
        time.sleep(max(0.0, fault.hold - waited))
        disk.empty()
        if proc is not None and proc.poll() is not None:
            code = proc.returncode
            offline = "no log dir is left online" in broker.log()
            broker.start(timeout=60)  # as an operator would, once there is space again
            return (f"filled ({filled >> 20} MiB), broker exited {code} after {waited:.1f} s"
                    f"{' (its log dir offline)' if offline else ''}; emptied, started")
        return f"filled ({filled >> 20} MiB), broker still running after {waited:.1f} s; emptied"

    def heal(self) -> None:
        """Real time on every clock, space on every disk (before the campaign starts what is down)."""
        for clock in self.clocks.values():
            clock.set(0.0)
        for disk in self.disks.values():
            if disk.mounted:
                disk.empty()
