"""A data directory deleted under a running broker is the log-dir failure it is: the request that meets it
gets KAFKA_STORAGE_ERROR (not a dropped connection), one ERROR line names the dir, and the broker, whose
metadata lived there, stops as Kafka stops when its metadata log dir fails."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.conftest import CLIENT_TIMEOUT
from tests.support.broker import BrokerProcess
from tests.support.cluster import wait_for


def test_topic_creation_in_a_deleted_data_dir_answers_kafka_storage_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = BrokerProcess(tmp_path / "broker", {"log.dirs": str(data)}).start()
    try:
        shutil.rmtree(data)
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        with pytest.raises(KafkaException) as exc:
            admin.create_topics([NewTopic("after-rm", 1, 1)], request_timeout=CLIENT_TIMEOUT)["after-rm"].result(
                timeout=CLIENT_TIMEOUT)
        err: KafkaError = exc.value.args[0]
        assert err.code() == KafkaError.KAFKA_STORAGE_ERROR, err
        assert "metadata" in err.str(), err
        wait_for(lambda: b.proc is not None and b.proc.poll() is not None, timeout=30,
                 what="the broker to stop: its metadata log dir failed")
        log = b.log()
        assert f"Log dir {data} is offline: writing the metadata store" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    finally:
        b.stop()
