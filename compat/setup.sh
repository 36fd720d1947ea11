#!/usr/bin/env bash
# Prepares the compatibility suite's clients and the Apache Kafka it also runs against (idempotent; the
# suite also does this itself). kcat, a JDK, Maven and Node come from Debian (scripts/install.sh --test
# installs them); Kafka's jars come from Maven Central (compat/kafka/pom.xml, cached in ~/.m2).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m compat.env
exec "$PY" -m compat.realkafka resolve
