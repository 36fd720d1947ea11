#!/usr/bin/env bash
# One command from a fresh clone to a broker on 127.0.0.1:9092 (embedded metadata, data in ./data).
# Extra arguments go to `pykbroker serve`, e.g. scripts/run.sh --override num.partitions=3
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/pykbroker serve --override log.dirs="${PYKBROKER_DATA:-$PWD/data}" "$@"
