#!/usr/bin/env bash
# Prepares the compatibility suite's clients (idempotent; the suite also does this itself).
# kcat, a JDK and Node come from Debian (scripts/install.sh --test installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
exec "$PY" -m compat.env
