"""The parent of ``pykbroker serve --processes N``: starts the N brokers, restarts one that dies,
forwards SIGTERM/SIGINT and exits when every child is gone.

Each child is a plain ``pykbroker serve`` with the user's configuration plus its derived overrides
(plan.py), so a child behaves exactly as a broker started by hand. Children get their own process
group, so a terminal's Ctrl-C reaches only the parent, which forwards it once to every child (each then
does its controlled shutdown); and ``PR_SET_PDEATHSIG`` (SIGTERM) so that a parent killed with SIGKILL
still takes its children down cleanly instead of leaving them orphaned.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType

from pykbroker.multiprocess.plan import ProcessPlan
from pykbroker.multiprocess.restarts import GiveUp, Restart, RestartPolicy, describe_exit

log = logging.getLogger("pykbroker.multiprocess")

PR_SET_PDEATHSIG = 1
POLL_S = 0.1


def _die_with_parent(parent_pid: int) -> None:
    """In the child before exec: SIGTERM when the parent dies; exit at once if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        os._exit(1)
    if os.getppid() != parent_pid:  # the parent died between fork and prctl
        os._exit(1)


def _listening(address: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=0.2):
            return True
    except OSError:
        return False


@dataclass
class Child:
    """One child broker and what the supervisor knows of it."""

    plan: ProcessPlan
    policy: RestartPolicy
    proc: subprocess.Popen[bytes] | None = None
    listened: bool = False
    restart_at: float | None = None
    exit_statuses: list[int] = field(default_factory=list)


class Supervisor:
    """Runs the children until a signal or a child that cannot be kept up; ``run`` returns the exit status."""

    def __init__(self, plans: Sequence[ProcessPlan], base_args: Sequence[str], *, max_restarts: int = 5) -> None:
        self.base_args = list(base_args)  # `python -m pykbroker serve ...` without the derived overrides
        self.children = [Child(p, RestartPolicy(max_restarts=max_restarts)) for p in plans]
        self._signals: list[int] = []
        self._stopping = False
        self._status = 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)

    def _spawn(self, child: Child) -> None:
        args = [*self.base_args, "--log-broker-id", str(child.plan.broker_id)]
        for key, value in child.plan.overrides.items():
            args += ["--override", f"{key}={value}"]
        parent = os.getpid()
        child.proc = subprocess.Popen(args, process_group=0, preexec_fn=lambda: _die_with_parent(parent))
        child.listened = False
        child.restart_at = None
        log.info("started broker %(broker_id)d (process %(process)d of %(processes)d) as pid %(pid)d",
                 {"broker_id": child.plan.broker_id, "process": child.plan.index + 1, "processes": len(self.children),
                  "pid": child.proc.pid})

    def _forward(self, signum: int) -> None:
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                try:
                    os.kill(child.proc.pid, signum)
                except ProcessLookupError:
                    pass

    def _stop_all(self, why: str, status: int) -> None:
        if not self._stopping:
            log.info("stopping every broker: %(why)s", {"why": why})
        self._stopping = True
        self._status = max(self._status, status)
        for child in self.children:
            child.restart_at = None
        self._forward(signal.SIGTERM)

    def _handle_signals(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            name = signal.Signals(signum).name
            if self._stopping:
                # As a second signal to one broker: the children stop at once.
                log.info("received %(name)s again, forwarding it to every broker", {"name": name})
                self._forward(signum)
            else:
                self._stop_all(f"received {name}", 0)

    def _reap(self, now: float) -> None:
        for child in self.children:
            proc = child.proc
            if proc is None or proc.poll() is None:
                continue
            child.proc = None
            rc = proc.returncode
            child.exit_statuses.append(rc)
            how = describe_exit(rc)
            if self._stopping:
                log.info("broker %(broker_id)d (pid %(pid)d) stopped: %(how)s",
                         {"broker_id": child.plan.broker_id, "pid": proc.pid, "how": how})
                if rc != 0:
                    self._status = max(self._status, 1)
                continue
            decision = child.policy.on_exit(rc, now, ever_listened=child.listened)
            if isinstance(decision, Restart):
                log.warning("broker %(broker_id)d (pid %(pid)d) died (%(how)s); restart %(attempt)d in %(delay_s).1f "
                            "s",
                            {"broker_id": child.plan.broker_id, "pid": proc.pid, "how": how,
                             "attempt": decision.attempt, "delay_s": decision.at - now})
                child.restart_at = decision.at
            else:
                assert isinstance(decision, GiveUp)
                log.error("broker %(broker_id)d (pid %(pid)d) is not restarted: %(reason)s",
                          {"broker_id": child.plan.broker_id, "pid": proc.pid, "reason": decision.reason})
                self._stop_all(f"broker {child.plan.broker_id} could not be kept up", decision.exit_status)

    def _tick(self, now: float) -> None:
        for child in self.children:
            if child.proc is not None and not child.listened and _listening(child.plan.probe):
                child.listened = True
            if child.proc is None and child.restart_at is not None and now >= child.restart_at and not self._stopping:
                self._spawn(child)

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for child in self.children:
                self._spawn(child)
            while True:
                self._handle_signals()
                now = time.monotonic()
                self._reap(now)
                if self._stopping and all(c.proc is None for c in self.children):
                    break
                self._tick(now)
                time.sleep(POLL_S)
        finally:
            for child in self.children:  # only if run() itself failed: never leave a child behind
                if child.proc is not None and child.proc.poll() is None:
                    child.proc.kill()
                    child.proc.wait()
            for s, handler in previous.items():
                signal.signal(s, handler)
        log.info("every broker has stopped; exiting with status %(status)d", {"status": self._status})
        return self._status


def child_command(config_path: str | None, overrides: Sequence[str], log_level: str) -> list[str]:
    """``pykbroker serve`` as the user gave it, minus ``--processes``; derived overrides come after."""
    args = [sys.executable, "-m", "pykbroker", "serve", "--log-level", log_level]
    if config_path is not None:
        args += ["--config", config_path]
    for item in overrides:
        args += ["--override", item]
    return args
