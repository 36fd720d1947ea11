"""The campaign's private network (tests/support/netns.py): namespaces joined by a bridge, reachable from the
test's namespace, partitioned by silent drops, healed, and removed without a trace."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import wait_for
from tests.support.netns import CLIENT, Network, netns_exists, remove_leftovers, unavailable

if unavailable() is not None:  # CI runs as root; the campaign needs this too
    raise RuntimeError(f"tests/nemesis needs network namespaces: {unavailable()}")

PORT = 18765
# A server in a node's namespace: accepts connections until killed, greets each with b"hi".
SERVE = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"hi")
    c.close()
"""
# A client in a node's namespace: prints "ok", "timeout" (a silent drop) or the error (e.g. a refusal).
CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5) as c:
        c.settimeout(1.5)
        print("ok" if c.recv(2) == b"hi" else "bad")
except TimeoutError:
    print("timeout")
except OSError as e:
    print(type(e).__name__)
"""


@pytest.fixture
def net() -> Iterator[Network]:
    network = Network(["a", "b", "c"]).open()
    servers = []
    try:
        for node in network.nodes:
            proc = network.popen(node, [sys.executable, "-c", SERVE, network.address(node), str(PORT)],
                                 stdout=subprocess.PIPE)
            servers.append(proc)
            assert proc.stdout is not None and proc.stdout.readline() == b"listening\n"
        yield network
    finally:
        for proc in servers:
            proc.kill()
            proc.wait(10)
        network.close()


def reach(net: Network, src: str, dst: str) -> str:
    """What a connection from ``src`` (a node or the clients) to ``dst``'s server gets."""
    if src == CLIENT:
        try:
            with socket.create_connection((net.address(dst), PORT), timeout=1.5) as c:
                c.settimeout(1.5)
                return "ok" if c.recv(2) == b"hi" else "bad"
        except TimeoutError:
            return "timeout"
        except OSError as e:
            return type(e).__name__
    out = subprocess.run([*net.exec_prefix(src), sys.executable, "-c", CONNECT, net.address(dst), str(PORT)],
                         capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


def test_every_node_reaches_every_other_and_the_clients_reach_all(net: Network) -> None:
    for dst in net.nodes:
        assert reach(net, CLIENT, dst) == "ok"
    assert reach(net, "a", "b") == "ok"
    assert reach(net, "c", "a") == "ok"
    # The nodes' addresses are only in their namespaces: nothing in ours listens on them.
    ours = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    assert net.address("a") not in ours and net.address(CLIENT) in ours


def test_a_cut_drops_silently_both_ways_and_heal_restores(net: Network) -> None:
    net.cut("a", "b")
    assert reach(net, "a", "b") == "timeout"
    assert reach(net, "b", "a") == "timeout"
    assert reach(net, "a", "c") == "ok" and reach(net, "c", "b") == "ok"
    assert reach(net, CLIENT, "a") == "ok"
    net.cut(CLIENT, "c")
    assert reach(net, CLIENT, "c") == "timeout"
    assert reach(net, "a", "c") == "ok"
    net.heal()
    assert net.rules("a") == [] and net.rules("c") == [] and not net.cuts
    assert reach(net, "a", "b") == "ok" and reach(net, "b", "a") == "ok" and reach(net, CLIENT, "c") == "ok"


def test_partition_cuts_every_pair_across_groups(net: Network) -> None:
    net.partition(["a"], ["b", "c", CLIENT])
    assert net.cuts == {frozenset(p) for p in (("a", "b"), ("a", "c"), ("a", CLIENT))}
    assert reach(net, "b", "a") == "timeout" and reach(net, CLIENT, "a") == "timeout"
    assert reach(net, "b", "c") == "ok" and reach(net, CLIENT, "b") == "ok"
    net.heal()
    assert reach(net, "b", "a") == "ok" and reach(net, CLIENT, "a") == "ok"


def test_a_process_started_in_a_namespace_is_the_command_itself(net: Network) -> None:
    """Signals (kill -9, SIGSTOP) go to the pid the test holds: ``ip netns exec`` must have exec'ed."""
    proc = net.popen("b", ["sleep", "30"])
    try:
        wait_for(lambda: Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep" or None, timeout=10,
                 what="ip netns exec to exec sleep")
        ns_inode = os.stat(f"/run/netns/{net.namespace('b')}").st_ino
        assert os.stat(f"/proc/{proc.pid}/ns/net").st_ino == ns_inode != os.stat("/proc/self/ns/net").st_ino
    finally:
        proc.kill()
        proc.wait(10)


def test_close_leaves_nothing() -> None:
    net = Network(["x", "y"]).open()
    names = [net.namespace("x"), net.namespace("y"), net.hub]
    assert all(netns_exists(n) for n in names)
    net.close()
    assert net.leftovers() == [] and not any(netns_exists(n) for n in names)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert f" {net.tag}@" not in links and f" {net.tag}:" not in links


def test_open_removes_what_a_crashed_run_left() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait(10)
    wait_for(lambda: not Path(f"/proc/{dead.pid}").exists() or None, timeout=10, what="the pid to be gone")
    stale = f"pkbn{dead.pid}x1-hub"
    subprocess.run(["ip", "netns", "add", stale], check=True, timeout=20)
    subprocess.run(["ip", "link", "add", f"pkbn{dead.pid}x1", "type", "veth", "peer", "name", "eth0", "netns",
                    stale], check=True, timeout=20)
    try:
        with Network(["x"]) as net:
            assert net.opened
            assert not netns_exists(stale)
            links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
            assert f"pkbn{dead.pid}x1@" not in links
    finally:
        remove_leftovers()
        subprocess.run(["ip", "netns", "del", stale], capture_output=True, timeout=20)
