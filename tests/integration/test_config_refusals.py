"""One rule for a configuration the broker will not run with, as README "Settings not implemented" says: exit
status 2 and one ERROR line that names the key, where it came from (file, environment variable, --override)
and why; a setting of a feature pykbroker lacks ends with the pointer to the README; never a Python error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import free_port

HINT = "see README 'Settings not implemented')"  # the end of every refusal of a missing feature


def _refused(tmp_path: Path, overrides: dict[str, str], env: dict[str, str] | None = None,
             config: str | None = None) -> str:
    args = [sys.executable, "-m", "pykbroker", "serve", "--override", f"log.dirs={tmp_path / 'logs'}",
            "--override", f"listeners=PLAINTEXT://127.0.0.1:{free_port()}"]
    if config is not None:
        path = tmp_path / "server.properties"
        path.write_text(config)
        args += ["--config", str(path)]
    for k, v in overrides.items():
        args += ["--override", f"{k}={v}"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYKBROKER_")}
    out = subprocess.run(args, capture_output=True, timeout=60, text=True, env={**clean, **(env or {})})
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    errors = [line for line in text.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Traceback" not in text and "invalid literal" not in text, text
    return errors[0]


@pytest.mark.parametrize(("overrides", "says"), [
    ({"broker.id": "-1", "zookeeper.connect": "127.0.0.1:2181"}, "broker.id=-1 is refused with zookeeper.connect"),
    ({"listeners": "SSL://127.0.0.1:19093"}, "ssl.keystore.type=JKS (Kafka's default) is refused for listener SSL"),
    ({"listeners": "SASL_PLAINTEXT://127.0.0.1:19094"}, "GSSAPI"),
])
def test_a_setting_of_a_missing_feature_is_refused_with_the_pointer(tmp_path: Path, overrides: dict[str, str],
                                                                    says: str) -> None:
    line = _refused(tmp_path, overrides)
    assert says in line and line.endswith(HINT), line


def test_every_refusal_names_where_the_key_came_from(tmp_path: Path) -> None:
    line = _refused(tmp_path, {"ssl.keymanager.algorithm": "SunX509"})
    assert "(from --override ssl.keymanager.algorithm=...)" in line and line.endswith(HINT), line
    line = _refused(tmp_path, {}, env={"PYKBROKER_DATA": "/srv/data"})
    assert "unknown configuration 'data'" in line and "environment variable PYKBROKER_DATA" in line, line
    line = _refused(tmp_path, {}, env={"PYKBROKER_LOG_RETENTION_HOURS": "a week"})
    assert "expected an integer" in line and "environment variable PYKBROKER_LOG_RETENTION_HOURS" in line, line
    line = _refused(tmp_path, {}, config="log.retention.hours=1\nlog.segmnet.bytes=1000\n")
    assert "unknown configuration 'log.segmnet.bytes'" in line and "config file" in line, line
    line = _refused(tmp_path, {"num.partitions": "many"})
    assert "expected an integer" in line and "--override num.partitions" in line, line
