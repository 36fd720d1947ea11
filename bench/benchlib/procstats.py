"""The machine and its processes, read from ``/proc``: a broker process tree's CPU time and RSS
(anonymous too), this client's CPU time, the whole machine's busy time, and a sampler of the
broker's peak RSS; plus the facts about the machine a report starts with."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import threading
import time
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def _proc_children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2 :].split()
        children.setdefault(int(rest[1]), []).append(int(name))
    return children


def _proc_tree(pid: int) -> list[int]:
    children = _proc_children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def proc_cpu_rss(pid: int) -> tuple[float, int]:
    """(utime+stime [+ reaped children] in seconds, RSS in KiB) of one process."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    # fields after "(comm) ": state ppid ... utime(14) stime(15) cutime(16) cstime(17) ... rss(24)
    rest = data[data.rfind(b")") + 2 :].split()
    utime, stime, cutime, cstime = (int(x) for x in rest[11:15])
    rss_pages = int(rest[21])
    return (utime + stime + cutime + cstime) / CLK_TCK, rss_pages * PAGE_KIB


def _thread_runtimes(pid: int) -> dict[int, int]:
    """Per-thread on-CPU nanoseconds (first field of /proc/PID/task/TID/schedstat)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with (
            contextlib.suppress(OSError, ValueError, IndexError),
            open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f,
        ):
            out[int(tid)] = int(f.read().split()[0])
    return out


@dataclass
class Usage:
    """A snapshot of the broker process tree: CPU (two sources) and RSS."""

    stat_cpu: dict[int, float]  # pid -> utime+stime+cutime+cstime seconds (10 ms ticks)
    threads: dict[int, dict[int, int]]  # pid -> tid -> ns on CPU (schedstat)
    rss_kib: int
    rss_anon_kib: int = 0

    def cpu_since(self, before: Usage) -> float:
        """CPU seconds between two snapshots.

        Uses per-thread schedstat (ns resolution) when every thread seen before is
        still alive; otherwise (a thread or process exited in between, so its
        time would be lost) falls back to the tick-based /proc/PID/stat figure.
        """
        total = 0.0
        for pid, after_stat in self.stat_cpu.items():
            b_threads = before.threads.get(pid)
            a_threads = self.threads.get(pid)
            if b_threads is not None and a_threads is not None and set(b_threads) <= set(a_threads):
                total += sum(ns - b_threads.get(tid, 0) for tid, ns in a_threads.items()) / 1e9
            else:
                total += after_stat - before.stat_cpu.get(pid, 0.0)
        # processes of the tree that exited in between are in their parent's cutime/cstime
        return total


def broker_usage(pid: int | None) -> Usage | None:
    """CPU time and RSS of the process tree rooted at ``pid`` (None if it is gone)."""
    if pid is None:
        return None
    try:
        pids = _proc_tree(pid)
    except OSError:
        return None
    u = Usage({}, {}, 0)
    for i, p in enumerate(pids):
        try:
            c, r = proc_cpu_rss(p)
            threads = _thread_runtimes(p)
        except (OSError, ValueError, IndexError):
            if i == 0:
                return None  # the broker itself is gone
            continue
        u.stat_cpu[p] = c
        u.threads[p] = threads
        u.rss_kib += r
        u.rss_anon_kib += rss_anon_kib(p)
    return u


def rss_anon_kib(pid: int) -> int:
    """RssAnon from /proc/PID/status: resident heap/stack, excluding mapped files."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def find_listener_pid(port: int) -> int | None:
    """PID of the local process listening on TCP ``port`` (needs access to its fds)."""
    inodes = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    local, state, inode = parts[1], parts[3], parts[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{inode}]")
        except OSError:
            continue
    if not inodes:
        return None
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fd_dir = f"/proc/{name}/fd"
        try:
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    if os.readlink(f"{fd_dir}/{fd}") in inodes:
                        return int(name)
        except OSError:
            continue
    return None


def client_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def machine_busy() -> float:
    """Machine-wide busy CPU seconds (all cores) from the first line of /proc/stat."""
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    # user nice system idle iowait irq softirq steal
    return (sum(vals) - vals[3] - vals[4]) / CLK_TCK


@dataclass
class Snap:
    broker: Usage | None
    client: float
    machine: float
    t: float


def snap(pid: int | None) -> Snap:
    return Snap(broker_usage(pid), client_cpu(), machine_busy(), time.perf_counter())


class Sampler(threading.Thread):
    """Samples the broker's RSS every ``interval`` seconds and keeps the peak."""

    def __init__(self, pid: int | None, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.peak_kib = 0
        self.peak_anon_kib = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            u = broker_usage(self.pid)
            if u is not None:
                self.peak_kib = max(self.peak_kib, u.rss_kib)
                self.peak_anon_kib = max(self.peak_anon_kib, u.rss_anon_kib)

    def stop(self) -> None:
        self._halt.set()


def pid_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


def machine_facts() -> dict[str, str]:
    facts = {"nproc": str(os.cpu_count()), "kernel": platform.release(), "python": platform.python_version()}
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                facts["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        kib = int(f.readline().split()[1])
        facts["memory"] = f"{kib / 1024 / 1024:.1f} GiB"
    with contextlib.suppress(Exception):
        import confluent_kafka

        facts["confluent-kafka"] = f"{confluent_kafka.__version__} (librdkafka {confluent_kafka.libversion()[0]})"
    return facts
