"""When a child broker that died is started again (sans-I/O, so the policy is tested without processes).

A broker process that dies is a broker failure the cluster already survives (its leaderships move to
in-sync replicas), so the supervisor restarts it, after a backoff that doubles with each recent restart
so a broker that cannot stay up does not spin. Restarts are bounded: past ``max_restarts`` within
``window_s`` the supervisor gives up on the host (stops the other children and exits non-zero), since
something outside the broker (disk, ZooKeeper, configuration) needs a person. A child that exits with
status 2 (its configuration was refused) or fails before it ever listened is not restarted: doing the
same again cannot help.
"""

from __future__ import annotations

import signal
from collections import deque
from dataclasses import dataclass, field

CONFIG_REFUSED = 2  # the exit status of `pykbroker serve` when its configuration is refused


@dataclass(frozen=True, slots=True)
class Restart:
    """Start the child again at ``at`` (monotonic seconds)."""

    at: float
    attempt: int


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Do not restart; stop the host with ``exit_status``, saying ``reason``."""

    reason: str
    exit_status: int


def describe_exit(returncode: int) -> str:
    """``exit status 1`` or ``killed by SIGKILL``, as a Popen return code reads."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


@dataclass
class RestartPolicy:
    """Per child: the times of its recent restarts, and the backoff that follows from them."""

    max_restarts: int = 5
    window_s: float = 300.0
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    _recent: deque[float] = field(default_factory=deque)

    def on_exit(self, returncode: int, now: float, *, ever_listened: bool) -> Restart | GiveUp:
        """The child exited (not asked to) with ``returncode`` at ``now``."""
        how = describe_exit(returncode)
        if returncode == CONFIG_REFUSED:
            return GiveUp(f"{how}: its configuration was refused", CONFIG_REFUSED)
        if not ever_listened and returncode > 0:
            return GiveUp(f"{how} before it listened: it cannot start", returncode)
        while self._recent and now - self._recent[0] > self.window_s:
            self._recent.popleft()
        if len(self._recent) >= self.max_restarts:
            return GiveUp(f"{how}, after {len(self._recent)} restarts within {self.window_s:g} s", 1)
        backoff = min(self.max_backoff_s, self.initial_backoff_s * 2 ** len(self._recent))
        self._recent.append(now)
        return Restart(now + backoff, len(self._recent))
