"""Where the Spark Kafka connector comes from (pipelines.spark_env): a jars directory, or Maven's copy of the
connector at exactly pyspark's version.  No Spark or JVM session; the Maven cases run the real ``mvn``."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from pipelines import spark_env
from pipelines.spark_env import ConnectorUnavailable, artifact_of, cached_jars, connector_conf, resolve_jars

pytestmark = pytest.mark.xdist_group("spark")
needs_pyspark = pytest.mark.skipif(importlib.util.find_spec("pyspark") is None, reason="pyspark is not installed")


def _touch(d: Path, *names: str) -> None:
    d.mkdir(exist_ok=True)
    for n in names:
        (d / n).write_bytes(b"PK")


def test_artifact_ids_of_maven_jar_names() -> None:
    assert artifact_of("spark-sql-kafka-0-10_2.13-4.0.0.jar") == "spark-sql-kafka-0-10_2.13"
    assert artifact_of("kafka-clients-3.9.0.jar") == "kafka-clients"
    assert artifact_of("commons-pool2-2.12.0.jar") == "commons-pool2"
    assert artifact_of("zstd-jni-1.5.6-9.jar") == "zstd-jni"
    assert artifact_of("log4j-1.2-api-2.24.3.jar") == "log4j-1.2-api"
    assert artifact_of("scala-parallel-collections_2.13-1.2.0.jar") == "scala-parallel-collections_2.13"
    assert artifact_of("netty-transport-native-epoll-4.1.118.Final-linux-x86_64.jar") == \
        "netty-transport-native-epoll"
    assert artifact_of("no-version.jar") is None


def test_jars_dir_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _touch(tmp_path, "spark-sql-kafka-0-10_2.13-4.0.0.jar", "commons-pool2-2.12.0.jar", "kafka-clients-3.9.0.jar")
    monkeypatch.setenv(spark_env.JARS_DIR_ENV, str(tmp_path))
    c = connector_conf(cache_root=tmp_path / "unused")
    jars = c.conf["spark.jars"].split(",")
    assert sorted(Path(j).name for j in jars) == sorted(p.name for p in tmp_path.glob("*.jar"))
    assert not (tmp_path / "unused").exists()


def test_jars_dir_needs_the_connector_and_kafka_clients(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(spark_env.JARS_DIR_ENV, str(tmp_path))
    _touch(tmp_path, "kafka-clients-3.9.0.jar")
    with pytest.raises(ConnectorUnavailable, match="spark-sql-kafka-0-10_2.13"):
        connector_conf()
    (tmp_path / "kafka-clients-3.9.0.jar").unlink()
    _touch(tmp_path, "spark-sql-kafka-0-10_2.13-4.0.0.jar")
    with pytest.raises(ConnectorUnavailable, match="kafka-clients"):
        connector_conf()
    monkeypatch.setenv(spark_env.JARS_DIR_ENV, str(tmp_path / "nope"))
    with pytest.raises(ConnectorUnavailable, match="not a directory"):
        connector_conf()


@needs_pyspark
def test_maven_copies_the_connector_at_pysparks_version_and_what_pyspark_lacks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(spark_env.JARS_DIR_ENV, raising=False)
    version = spark_env.pyspark_version()
    c = connector_conf()  # the checkout's copy (scripts/install.sh --test made it; else mvn makes it now)
    jars = [Path(j) for j in c.conf["spark.jars"].split(",")]
    assert all(j.parent == spark_env.CACHE_ROOT / version for j in jars), jars
    by_artifact = {artifact_of(j.name): j.name for j in jars}
    assert set(by_artifact) == {"spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13",
                                "kafka-clients", "commons-pool2"}, by_artifact
    assert by_artifact["spark-sql-kafka-0-10_2.13"] == f"spark-sql-kafka-0-10_2.13-{version}.jar"
    assert by_artifact["kafka-clients"].startswith("kafka-clients-3.9.")
    assert not set(by_artifact) & spark_env.pyspark_shipped_artifacts()

    # A complete copy is used as it is: no mvn needed.
    shutil.copytree(spark_env.CACHE_ROOT / version, tmp_path / version)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    copied = resolve_jars(version, tmp_path)
    assert copied == [tmp_path / version / j.name for j in jars]
    # A partial copy is not: it must be fetched again, which needs mvn.
    copied[0].unlink()
    assert cached_jars(version, tmp_path) is None
    with pytest.raises(ConnectorUnavailable, match="no mvn on PATH"):
        resolve_jars(version, tmp_path)


@needs_pyspark
def test_a_copy_made_from_another_pom_is_stale(tmp_path: Path) -> None:
    d = tmp_path / "4.0.0"
    _touch(d, "spark-sql-kafka-0-10_2.13-4.0.0.jar", "kafka-clients-3.9.0.jar")
    names = ["spark-sql-kafka-0-10_2.13-4.0.0.jar", "kafka-clients-3.9.0.jar"]
    (d / spark_env.COMPLETE).write_text("\n".join(["0" * 64, *names]) + "\n")
    assert cached_jars("4.0.0", tmp_path) is None
    (d / spark_env.COMPLETE).write_text("\n".join([spark_env._pom_digest(), *names]) + "\n")
    assert cached_jars("4.0.0", tmp_path) == [d / n for n in names]


@needs_pyspark
def test_a_version_maven_cannot_resolve_gives_mavens_reason(tmp_path: Path) -> None:
    with pytest.raises(ConnectorUnavailable, match=r"mvn could not resolve spark-sql-kafka-0-10_2.13:0\.0\.0-none"):
        resolve_jars("0.0.0-none", tmp_path, timeout=300)
    assert not (tmp_path / "0.0.0-none").exists()
