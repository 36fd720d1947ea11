#!/usr/bin/env bash
# One command from a fresh clone to a broker on 127.0.0.1:9092 (embedded metadata, data in ./data).
# Extra arguments go to `pykbroker serve`, e.g. scripts/run.sh --override num.partitions=3
#
# The data directory is the broker's own setting log.dirs, so set it as any setting:
#   PYKBROKER_LOG_DIRS=/srv/kafka-data bash scripts/run.sh
#   bash scripts/run.sh --override log.dirs=/srv/kafka-data
# ./data is the default only when neither that variable nor --config is given (a config file
# names its own log.dirs).  The first run installs into .venv; later runs start at once unless
# pyproject.toml, setup.py or the C sources changed (scripts/install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
if [ -n "${PYKBROKER_DATA:-}" ]; then
    # A deprecated name for the data directory; every PYKBROKER_* variable is a broker setting, and
    # there is no setting called "data", so translate it rather than let the broker refuse it.
    echo "run.sh: PYKBROKER_DATA is deprecated; use PYKBROKER_LOG_DIRS (the log.dirs setting)" >&2
    export PYKBROKER_LOG_DIRS="${PYKBROKER_LOG_DIRS:-$PYKBROKER_DATA}"
fi
unset PYKBROKER_DATA
if [ -z "${PYKBROKER_LOG_DIRS:-}" ] && [[ " $* " != *" --config"* ]]; then
    export PYKBROKER_LOG_DIRS="$PWD/data"
fi
exec .venv/bin/pykbroker serve "$@"
