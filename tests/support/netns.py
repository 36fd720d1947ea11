"""A private network of Linux network namespaces, so that tests can partition brokers and ZooKeeper.

One namespace per node (``zk1``, ``b1``, ...), each with loopback up and one veth end (``eth0``) holding an
address on a private /24; the other veth ends are ports of a Linux bridge that lives in a hub namespace of its
own. The clients stay in the test's own (root) namespace: one veth from it into the bridge carries only an
address on the private /24 (the kernel's connected route for it comes with the address; no other route, no
NAT, no firewall rule is touched there), so client threads need no ``setns``.

Partitions are silent drops, as Jepsen makes them: iptables DROP rules for a peer's address in the INPUT and
OUTPUT chains of a node's namespace (never the root namespace's). ``heal`` flushes them all.

Names start with ``pkbn<pid>x<n>`` (namespaces ``pkbn<pid>x<n>-<node>``, the root-side veth ``pkbn<pid>x<n>``),
so ``open`` removes what an earlier run whose process is gone left behind, and leaves other live runs alone.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

PREFIX = "pkbn"
CLIENT = "client"  # the root namespace's end of the network, where the test's clients run
_SUBNETS = "10.213"  # 10.213.<n>.0/24, one per network: a private range nothing else here uses
_NAME = re.compile(rf"^{PREFIX}(\d+)x(\d+)")
_COUNTER = itertools.count(1)
_TAKEN: set[int] = set()  # third octets of this process's open networks


class NetnsError(RuntimeError):
    """The namespaces could not be made or changed; the message has the command and what it said."""


def _tool(name: str) -> str:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin") or name


IP = _tool("ip")
IPTABLES = _tool("iptables")


def unavailable() -> str | None:
    """Why this process cannot build namespaces (None: it can try)."""
    if os.geteuid() != 0:
        return "network namespaces and iptables need root (CAP_SYS_ADMIN and CAP_NET_ADMIN): run as root"
    for tool in (IP, IPTABLES):
        if not Path(tool).is_file():
            return f"{tool!r} not found (Debian packages iproute2 and iptables)"
    return None


def _run(*args: str, check: bool = True) -> str:
    """One command, bounded in time; its stdout. A failure raises with what the command said."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetnsError(f"{' '.join(args)}: {e}") from e
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(args)} exited with {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _run(IP, "netns", "list").splitlines() if line.strip()]


def netns_exists(name: str) -> bool:
    return name in _namespaces()


def _root_links() -> list[str]:
    return [line.split()[0].split("@")[0] for line in _run(IP, "-o", "-br", "link", "show").splitlines()
            if line.strip()]


def remove_leftovers() -> list[str]:
    """Delete the namespaces and root-side links of earlier runs whose process is gone; what was deleted."""
    gone: list[str] = []
    for link in _root_links():
        m = _NAME.match(link)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            _run(IP, "link", "del", link, check=False)
            gone.append(link)
    for ns in _namespaces():
        m = _NAME.match(ns)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            _run(IP, "netns", "del", ns, check=False)
            gone.append(ns)
    return gone


def _free_octet() -> int:
    """A /24 of 10.213.0.0/16 that no address or route of the root namespace, nor another open network of
    this process, uses."""
    used = _run(IP, "-4", "-o", "addr", "show") + _run(IP, "-4", "route", "show")
    for n in range(1, 255):
        if n not in _TAKEN and f"{_SUBNETS}.{n}." not in used:
            return n
    raise NetnsError(f"every /24 of {_SUBNETS}.0.0/16 is in use")


class Network:
    """The namespaces of ``nodes`` joined by a bridge, plus the root namespace's veth (``CLIENT``).

    Addresses are fixed at construction (before ``open``), so that configs can name them."""

    def __init__(self, nodes: list[str]) -> None:
        if len(set(nodes)) != len(nodes) or CLIENT in nodes or not nodes or len(nodes) > 200:
            raise ValueError(f"nodes must be 1 to 200 distinct names other than {CLIENT!r}: {nodes}")
        self.nodes = list(nodes)
        self.tag = f"{PREFIX}{os.getpid()}x{next(_COUNTER)}"
        self.hub = f"{self.tag}-hub"
        self.octet = _free_octet()
        _TAKEN.add(self.octet)
        self._addresses = {CLIENT: f"{_SUBNETS}.{self.octet}.1",
                           **{node: f"{_SUBNETS}.{self.octet}.{10 + i}" for i, node in enumerate(nodes)}}
        self.cuts: set[frozenset[str]] = set()
        self.opened = False

    def address(self, node: str) -> str:
        return self._addresses[node]

    def namespace(self, node: str) -> str:
        if node not in self.nodes:
            raise KeyError(node)
        return f"{self.tag}-{node}"

    def exec_prefix(self, node: str) -> list[str]:
        """Prepend to a command line to run it in ``node``'s namespace (``ip netns exec`` execs the command,
        so the started process's pid is the command's own)."""
        return [IP, "netns", "exec", self.namespace(node)]

    def open(self) -> Network:
        reason = unavailable()
        if reason is not None:
            raise NetnsError(reason)
        remove_leftovers()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        self.opened = True
        return self

    def _build(self) -> None:
        # Nothing addressed to the private range ever leaves the host: where no network's /24 route (more
        # specific) matches, for example while another process sets one up or after its link is gone, the
        # root namespace answers "unreachable" instead of sending it out of its default route.
        _run(IP, "route", "replace", "unreachable", f"{_SUBNETS}.0.0/16")
        hub = self.hub
        _run(IP, "netns", "add", hub)
        _run(IP, "-n", hub, "link", "set", "lo", "up")
        _run(IP, "-n", hub, "link", "add", "br0", "type", "bridge")
        _run(IP, "-n", hub, "link", "set", "br0", "up")
        _run(IP, "link", "add", self.tag, "type", "veth", "peer", "name", "p-client", "netns", hub)
        _run(IP, "-n", hub, "link", "set", "p-client", "master", "br0", "up")
        _run(IP, "addr", "add", f"{self.address(CLIENT)}/24", "dev", self.tag)
        _run(IP, "link", "set", self.tag, "up")
        for i, node in enumerate(self.nodes):
            ns = self.namespace(node)
            _run(IP, "netns", "add", ns)
            _run(IP, "-n", ns, "link", "set", "lo", "up")
            _run(IP, "-n", hub, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run(IP, "-n", hub, "link", "set", f"p{i}", "master", "br0", "up")
            _run(IP, "-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", "eth0")
            _run(IP, "-n", ns, "link", "set", "eth0", "up")

    def _iptables(self, node: str, *args: str) -> None:
        _run(IP, "netns", "exec", self.namespace(node), IPTABLES, "-w", "10", *args)

    def cut(self, a: str, b: str) -> None:
        """Drop, silently, every packet between ``a`` and ``b`` (node names or ``CLIENT``), both ways: the
        rules live in a node's namespace (``a``'s, or ``b``'s when ``a`` is the clients)."""
        if a == b:
            raise ValueError(f"cannot cut {a} from itself")
        node, peer = (b, a) if a == CLIENT else (a, b)
        self.namespace(node)  # a known node
        addr = self.address(peer)
        self._iptables(node, "-I", "INPUT", "-s", addr, "-j", "DROP")
        self._iptables(node, "-I", "OUTPUT", "-d", addr, "-j", "DROP")
        self.cuts.add(frozenset((a, b)))

    def partition(self, *groups: list[str]) -> None:
        """Cut every member of each group from every member of every other group."""
        for i, left in enumerate(groups):
            for right in groups[i + 1:]:
                for a in left:
                    for b in right:
                        self.cut(a, b)

    def heal(self) -> None:
        """Remove every drop rule: all nodes reach each other and the clients again."""
        for node in self.nodes:
            self._iptables(node, "-F", "INPUT")
            self._iptables(node, "-F", "OUTPUT")
        self.cuts.clear()

    def rules(self, node: str) -> list[str]:
        """The node's INPUT and OUTPUT rules, as ``iptables -S`` prints them."""
        out = _run(IP, "netns", "exec", self.namespace(node), IPTABLES, "-w", "10", "-S")
        return [line for line in out.splitlines() if line.startswith("-A ")]

    def popen(self, node: str, args: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """A process in ``node``'s namespace (its pid is the command's, see ``exec_prefix``)."""
        return subprocess.Popen([*self.exec_prefix(node), *args], **kwargs)  # type: ignore[call-overload]

    def leftovers(self) -> list[str]:
        """This network's namespaces and root-side link that still exist."""
        return [n for n in _namespaces() if n.startswith(f"{self.tag}-")] + \
            [link for link in _root_links() if link == self.tag]

    def close(self, timeout: float = 20.0) -> None:
        """Delete the root-side link and every namespace (with them, the bridge and the veths); bounded wait
        until none is listed."""
        _run(IP, "link", "del", self.tag, check=False)
        for ns in [self.namespace(n) for n in self.nodes] + [self.hub]:
            _run(IP, "netns", "del", ns, check=False)
        deadline = time.monotonic() + timeout
        for _ in range(int(timeout / 0.1) + 1):
            if not self.leftovers() or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.cuts.clear()
        self.opened = False
        _TAKEN.discard(self.octet)
        left = self.leftovers()
        if left:
            raise NetnsError(f"still there {timeout} s after deletion: {left}")

    def __enter__(self) -> Network:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
