#!/usr/bin/env bash
# One command from a fresh clone to every test: installs what the suites need, then runs
# lint, type checks, unit and integration tests, the compatibility suite and the container tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
[ -f scripts/setup-podman.sh ] && bash scripts/setup-podman.sh
export PYTHONDONTWRITEBYTECODE=1
echo "== ruff"; .venv/bin/ruff check pykbroker tests compat bench pipelines
echo "== mypy"; .venv/bin/mypy
echo "== pytest"
.venv/bin/pytest -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" --dist loadgroup -q tests "$@"
echo "== compat (the same scenarios with nine client implementations, against a pykbroker subprocess)"
bash compat/setup.sh
.venv/bin/pytest -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" -q compat
echo "== compat again, against a 3-broker pykbroker cluster (ZooKeeper + 3 brokers, bootstrap = one broker)"
.venv/bin/pytest -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" -q compat --pykbroker-cluster 3
