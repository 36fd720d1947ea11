"""Where the Spark Kafka connector comes from, and a local SparkSession that uses it.

The connector (``spark-sql-kafka-0-10_2.13``) and its runtime dependencies (``spark-token-provider-kafka-0-10``,
``kafka-clients``, ``commons-pool2``) are not in the pyspark wheel.  Two sources, tried in order:

1. ``SPARK_KAFKA_JARS_DIR``: a directory of jars, every ``*.jar`` in it goes on ``spark.jars``.  It must hold
   ``spark-sql-kafka-0-10_2.13-<version>.jar`` and ``kafka-clients-<version>.jar``.
2. ``.cache/spark-kafka/<pyspark version>/`` in this checkout: the connector at exactly the installed pyspark's
   version and its runtime dependencies, less the jars pyspark already ships, copied there by Maven
   (``mvn dependency:copy-dependencies`` on ``pipelines/maven/pom.xml``; artifacts cached in ``~/.m2``).
   ``scripts/install.sh --test`` fills it (``python -m pipelines.spark_env``); when it is missing or stale and
   ``mvn`` is on ``PATH``, :func:`connector_conf` fills it first.

If neither is available :func:`connector_conf` raises :class:`ConnectorUnavailable` with a plain reason.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Not PYKBROKER_*: the broker reads every PYKBROKER_* variable as a setting and stops on unknown ones.
JARS_DIR_ENV = "SPARK_KAFKA_JARS_DIR"
CONNECTOR_ARTIFACT = "spark-sql-kafka-0-10_2.13"
CLIENTS_ARTIFACT = "kafka-clients"
POM = Path(__file__).resolve().parent / "maven" / "pom.xml"
CACHE_ROOT = Path(__file__).resolve().parent.parent / ".cache" / "spark-kafka"
COMPLETE = ".complete"  # written last: the POM's hash, then the jar names
MVN_TIMEOUT = 900.0

# artifact-version[-classifier].jar, the version being the last "-<digits>." part:
# spark-sql-kafka-0-10_2.13-4.0.0.jar, zstd-jni-1.5.6-9.jar, log4j-1.2-api-2.24.3.jar.
_JAR_NAME = re.compile(r"^(?P<artifact>.+)-(?P<version>\d+\.[^-]*(?:-[^-]+)*)\.jar$")


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


def artifact_of(jar_name: str) -> str | None:
    """The artifact id of a Maven-named jar file (``kafka-clients-3.9.0.jar`` -> ``kafka-clients``)."""
    m = _JAR_NAME.match(jar_name)
    return m.group("artifact") if m else None


def pyspark_shipped_artifacts() -> set[str]:
    """Artifact ids of the jars in the pyspark wheel: Spark itself, Scala, Hadoop's client, slf4j and the rest."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ConnectorUnavailable("pyspark is not installed (pip install -e '.[spark]')")
    found: set[str] = set()
    for loc in spec.submodule_search_locations:
        for jar in (Path(loc) / "jars").glob("*.jar"):
            a = artifact_of(jar.name)
            if a:
                found.add(a)
    if not found:
        raise ConnectorUnavailable("the pyspark package has no jars/ directory")
    return found


def _check_jars(jars: list[Path], where: str) -> None:
    names = [j.name for j in jars]
    for artifact in (CONNECTOR_ARTIFACT, CLIENTS_ARTIFACT):
        if not any(artifact_of(n) == artifact for n in names):
            raise ConnectorUnavailable(f"{where} holds no {artifact}-<version>.jar")


def _jars_from_dir(d: Path) -> Connector:
    if not d.is_dir():
        raise ConnectorUnavailable(f"{JARS_DIR_ENV}={d} is not a directory")
    jars = sorted(d.glob("*.jar"))
    _check_jars(jars, f"{JARS_DIR_ENV}={d}")
    return Connector({"spark.jars": ",".join(str(j) for j in jars)}, f"jars from {JARS_DIR_ENV}={d}")


def _pom_digest() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def cached_jars(version: str, cache_root: Path = CACHE_ROOT) -> list[Path] | None:
    """The jars Maven copied for ``version``, or None when that copy is missing, partial or from another POM."""
    d = cache_root / version
    try:
        digest, *names = (d / COMPLETE).read_text().split()
    except (OSError, ValueError):
        return None
    jars = [d / n for n in names]
    if digest != _pom_digest() or not jars or not all(j.is_file() for j in jars):
        return None
    return jars


@contextmanager
def _lock(cache_root: Path) -> Iterator[None]:
    """One resolver at a time per checkout (pytest-xdist workers, install.sh)."""
    cache_root.mkdir(parents=True, exist_ok=True)
    with open(cache_root / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def resolve_jars(version: str | None = None, cache_root: Path = CACHE_ROOT, mvn: str | None = None,
                 timeout: float = MVN_TIMEOUT) -> list[Path]:
    """The connector's jars for ``version`` (default: the installed pyspark's), copied by Maven when not cached.

    Maven resolves ``spark-sql-kafka-0-10_2.13:<version>`` with its runtime scope and copies every jar whose
    artifact pyspark does not already ship (two copies of Spark or Scala on one classpath would clash).
    """
    version = version or pyspark_version()
    with _lock(cache_root):
        have = cached_jars(version, cache_root)
        if have is not None:
            return have
        mvn = mvn or shutil.which("mvn")
        if mvn is None:
            raise ConnectorUnavailable(
                f"the Spark Kafka connector {version} is not in {cache_root / version} and there is no mvn on PATH "
                "to fetch it (scripts/install.sh --test installs Maven and fetches it)")
        tmp = cache_root / f"{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        args = [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies", f"-Dspark.version={version}",
                "-DincludeScope=runtime", f"-DexcludeArtifactIds={','.join(sorted(pyspark_shipped_artifacts()))}",
                f"-DoutputDirectory={tmp}"]
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise ConnectorUnavailable(f"mvn did not resolve {CONNECTOR_ARTIFACT}:{version} within {timeout:.0f} s"
                                       ) from e
        if proc.returncode != 0:
            out = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise ConnectorUnavailable(f"mvn could not resolve {CONNECTOR_ARTIFACT}:{version} "
                                       f"(exit {proc.returncode}):\n{out}")
        jars = sorted(tmp.glob("*.jar"))
        _check_jars(jars, f"mvn's copy of {CONNECTOR_ARTIFACT}:{version}")
        (tmp / COMPLETE).write_text("\n".join([_pom_digest(), *(j.name for j in jars)]) + "\n")
        final = cache_root / version
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        have = cached_jars(version, cache_root)
        assert have is not None
        return have


def connector_conf(cache_root: Path = CACHE_ROOT) -> Connector:
    """The Spark settings that put the Kafka connector on the classpath, or ConnectorUnavailable."""
    jars_dir = os.environ.get(JARS_DIR_ENV)
    if jars_dir:
        return _jars_from_dir(Path(jars_dir))
    version = pyspark_version()
    jars = resolve_jars(version, cache_root)
    return Connector({"spark.jars": ",".join(str(j) for j in jars)},
                     f"{CONNECTOR_ARTIFACT} {version} from Maven Central, in {cache_root / version}")


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


def main() -> int:
    """Fetch the connector for the installed pyspark (scripts/install.sh --test), printing the jars."""
    try:
        jars = resolve_jars()
    except ConnectorUnavailable as e:
        print(f"spark_env: {e}", file=sys.stderr)
        return 1
    for j in jars:
        print(j)
    return 0


if __name__ == "__main__":
    sys.exit(main())
