"""Fixtures for the cluster tests: a real ZooKeeper and pykbroker broker subprocesses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cluster import Cluster
from tests.support.zookeeper import zookeeper_available

if not zookeeper_available():  # scripts/install.sh --test installs Debian's zookeeper package
    raise RuntimeError("ZooKeeper (Debian package zookeeper) is needed by tests/cluster: run scripts/install.sh --test")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three brokers on one standalone ZooKeeper, shared by a module's tests."""
    c = Cluster(tmp_path_factory.mktemp("cluster"), 3)
    with c:
        yield c
