"""Spark + pykbroker fixtures: one broker and one local SparkSession for the whole Spark suite.

The Spark Kafka connector is found by pipelines.spark_env (``SPARK_KAFKA_JARS_DIR``, else the jars Maven
copied into ``.cache/spark-kafka/<pyspark version>/``, fetching them first when they are missing); without
pyspark or java every test here skips with the reason, and a connector that Maven cannot fetch fails them.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pykbroker.config import BROKER_CONFIG_DEFS
from tests.spark.kafka_util import DEPRECATED_FETCHING, Kafka
from tests.support.broker import BrokerProcess

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipelines.spark_env import Connector

# Keys a broker of this tree may not know yet are dropped rather than stopping it.
_BROKER_OVERRIDES = {
    "pykbroker.delay.enable": "true",  # tests/spark/test_delayed.py
    "log.retention.check.interval.ms": "200",
    "log.cleaner.backoff.ms": "200",
    "log.segment.delete.delay.ms": "0",
    "offsets.topic.num.partitions": "3",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.num.partitions": "3",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "group.min.session.timeout.ms": "1000",
    "group.initial.rebalance.delay.ms": "0",
}


def _missing() -> str | None:
    """Why Spark cannot exist on this machine (no pyspark, no java), else None."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (pip install -e '.[spark]')"
    if shutil.which("java") is None:
        return "no java on PATH (Spark needs a JDK 17+)"
    return None


@cache
def _connector() -> Connector | str:
    """The connector settings, or why they cannot be had (computed once per process)."""
    from pipelines.spark_env import ConnectorUnavailable, connector_conf

    try:
        return connector_conf()
    except ConnectorUnavailable as e:
        return str(e)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the Spark tests on one xdist worker (one JVM), and skip those that need Spark where it cannot run."""
    here = Path(__file__).parent
    ours = [i for i in items if Path(str(i.fspath)).is_relative_to(here)]
    if not ours:
        return
    needs_spark = [i for i in ours if "connector" in getattr(i, "fixturenames", ())]
    reason = _missing() if needs_spark else None
    for item in ours:
        item.add_marker(pytest.mark.xdist_group("spark"))
    if reason is not None:
        for item in needs_spark:
            item.add_marker(pytest.mark.skip(reason=f"Spark tests did not run: {reason}"))


@pytest.fixture(scope="session")
def connector() -> Connector:
    """The connector jars; a connector that cannot be fetched fails the tests rather than skipping them."""
    c = _connector()
    if isinstance(c, str):
        pytest.fail(f"the Spark Kafka connector cannot be had: {c}", pytrace=False)
    return c


@pytest.fixture(scope="session")
def sbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    overrides = {k: v for k, v in _BROKER_OVERRIDES.items() if k in BROKER_CONFIG_DEFS}
    b = BrokerProcess(tmp_path_factory.mktemp("spark-broker"), overrides=overrides)
    b.start()
    try:
        yield b
    finally:
        b.kill()


@pytest.fixture(scope="session")
def kafka(sbroker: BrokerProcess) -> Iterator[Kafka]:
    k = Kafka(sbroker.bootstrap)
    yield k
    k.close()


@pytest.fixture(scope="session")
def spark(connector: Connector, sbroker: BrokerProcess,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """The shared session; it takes the broker so that it stops (and its cached producers close) first."""
    from pipelines.spark_env import local_session

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    s = local_session("pykbroker-tests", connector, **{"spark.sql.warehouse.dir": str(warehouse)})
    try:
        yield s
    finally:
        for q in s.streams.active:
            q.stop()
        s.stop()


@pytest.fixture(params=["admin", "consumer"])
def offset_fetching(request: pytest.FixtureRequest, spark: SparkSession) -> Iterator[str]:
    """Run a test over both of Spark's offset-lookup paths: AdminClient (default) and the deprecated consumer."""
    spark.conf.set(DEPRECATED_FETCHING, "true" if request.param == "consumer" else "false")
    try:
        yield request.param
    finally:
        spark.conf.unset(DEPRECATED_FETCHING)
