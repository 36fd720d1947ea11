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
# The 30 slowest tests are listed at the end, to see where the time goes.
.venv/bin/pytest -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" --dist loadgroup -q --durations=30 tests "$@"
# The compatibility suite against pykbroker (one broker, then a ZooKeeper cluster of three) and against
# Apache Kafka from Maven Central's jars (3.9 on ZooKeeper, one broker and three; 4.x in KRaft mode). Every
# run goes on even if one fails; then the runs side by side, failing on any scenario that fails (on Kafka the
# scenario is wrong; on pykbroker it is named with the Kafka runs where it passed).
echo "== compat setup (clients: the Java, JS and Go drivers; Apache Kafka's jars with Maven)"
bash compat/setup.sh
R="compat/results/$(date -u +%Y%m%dT%H%M%SZ)"
status=0
runs=()
compat_run() {
    local what=$1 out=$2
    shift 2
    echo "== compat against $what"
    local t0=$SECONDS
    .venv/bin/pytest -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" -q compat --results "$out" "$@" || status=1
    echo "== compat against $what: $((SECONDS - t0)) s"
    if [ -f "$out" ]; then runs+=("$out"); fi
}
compat_run "a pykbroker subprocess" "$R.json"
compat_run "a 3-broker pykbroker cluster (ZooKeeper + 3 brokers, bootstrap = one broker)" "$R-cluster3.json" \
    --pykbroker-cluster 3
compat_run "Apache Kafka 3.9, one broker on ZooKeeper" "$R-kafka-3.9.json" --kafka 3.9
compat_run "Apache Kafka 3.9, ZooKeeper + 3 brokers" "$R-kafka-3.9-cluster3.json" --kafka 3.9 --kafka-brokers 3
compat_run "Apache Kafka 4, one KRaft node" "$R-kafka-4.json" --kafka 4
if [ ${#runs[@]} -gt 0 ]; then
    echo "== compat runs side by side: $R-compatibility.md"
    .venv/bin/python -m compat.report --check --out "$R-compatibility.md" --coverage "$R-coverage.json" "${runs[@]}" \
        || status=1
fi
exit $status
