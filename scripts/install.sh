#!/usr/bin/env bash
# Installs what pykbroker needs on a fresh Debian machine (run as root, or with sudo available).
#   scripts/install.sh          # the broker: Python, a virtualenv in .venv, the package
#   scripts/install.sh --test   # plus everything the test suites use
#   PYKB_REINSTALL=1 scripts/install.sh [--test]   # install even if nothing changed
# It does the work only when its inputs changed: a stamp per mode in .venv holds a hash of
# pyproject.toml, setup.py, the C sources of pykbroker/_native and this script, so that
# scripts/run.sh starts the broker at once on every start but the first.  pip's output goes to
# .venv/install.log (shown when pip fails).
set -euo pipefail
cd "$(dirname "$0")/.."
WANT_TEST=0
[ "${1:-}" = "--test" ] && WANT_TEST=1
MODE=$([ $WANT_TEST -eq 1 ] && echo test || echo broker)

inputs_hash() {
    # File names too, so that adding or removing a C source also counts as a change.
    local f
    for f in pyproject.toml setup.py scripts/install.sh pykbroker/_native/*.c; do
        if [ -f "$f" ]; then echo "$f"; cat "$f"; fi
    done | sha256sum | cut -d' ' -f1
}
STAMP_DIR=.venv/.pykbroker-install
HASH=$(inputs_hash)
spark_jars() {
    # The Spark Kafka connector at exactly the installed pyspark's version, and its runtime dependencies
    # (kafka-clients, ...), from Maven Central into .cache/spark-kafka/<version>/ (~/.m2 caches the
    # artifacts); a complete copy is kept, so this costs a Python start when nothing changed.
    if ! .venv/bin/python -m pipelines.spark_env >/dev/null; then
        echo "install.sh: the Spark Kafka connector could not be fetched with Maven (above)" >&2
        exit 1
    fi
}
if [ -z "${PYKB_REINSTALL:-}" ] && [ -x .venv/bin/pykbroker ] && { [ $WANT_TEST -eq 0 ] || [ -x .venv/bin/pytest ]; } \
    && [ "$(cat "$STAMP_DIR/$MODE" 2>/dev/null)" = "$HASH" ]; then
    [ $WANT_TEST -eq 1 ] && spark_jars
    exit 0
fi
if [ $WANT_TEST -eq 1 ]; then
    echo "install.sh: installing pykbroker, its test dependencies and tools into .venv (log: .venv/install.log)"
else
    echo "install.sh: installing pykbroker into .venv (first run, or its dependencies changed; log: .venv/install.log)"
fi

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
APT_UPDATED=0
apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ $APT_UPDATED -eq 0 ]; then
        $SUDO apt-get update -qq
        APT_UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null || ! "$PY" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
    apt_install python3 python3-venv python3-pip
    PY=python3
fi
if ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then
    apt_install python3-venv
fi
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
LOG=.venv/install.log
: >"$LOG"
GO_NEEDED=1.26.8
go_toolchain() {
    # The machine's Go when it is new enough (/usr/local/go first, then PATH); otherwise Go's own toolchain
    # module from the Go module proxy (golang.org/toolchain, the archive `GOTOOLCHAIN` downloads) into
    # /usr/local/go, where the tests look first.
    local go have
    for go in /usr/local/go/bin/go "$(command -v go || true)"; do
        [ -n "$go" ] && [ -x "$go" ] || continue
        have=$("$go" env GOVERSION 2>/dev/null | sed 's/^go//')
        if [ -n "$have" ] && [ "$(printf '%s\n%s\n' "${GO_NEEDED%.*}" "$have" | sort -V | head -1)" = "${GO_NEEDED%.*}" ]; then
            return 0
        fi
    done
    local arch
    case "$(uname -m)" in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; *) arch=$(uname -m) ;; esac
    local mod="v0.0.1-go$GO_NEEDED.linux-$arch"
    echo "install.sh: Go $GO_NEEDED from the Go module proxy (golang.org/toolchain@$mod) into /usr/local/go"
    local tmp root=${GO_ROOT:-/usr/local/go}
    tmp=$(mktemp -d)
    python3 - "${GOPROXY_URL:-https://proxy.golang.org}/golang.org/toolchain/@v/$mod.zip" "$tmp" <<'PY'
import io, os, sys, urllib.request, zipfile
with urllib.request.urlopen(sys.argv[1], timeout=300) as r:
    data = r.read()
with zipfile.ZipFile(io.BytesIO(data)) as z:
    for info in z.infolist():
        path = z.extract(info, sys.argv[2])
        mode = info.external_attr >> 16
        if mode:
            os.chmod(path, mode & 0o7777)
PY
    $SUDO rm -rf "$root"
    $SUDO mv "$tmp/golang.org/toolchain@$mod" "$root"
    rm -rf "$tmp"
    "$root/bin/go" version
}
pip_install() {
    if ! .venv/bin/pip install --disable-pip-version-check "$@" >>"$LOG" 2>&1; then
        tail -n 40 "$LOG" >&2
        echo "install.sh: pip install $* failed; the whole log is in $LOG" >&2
        exit 1
    fi
}
.venv/bin/python -m pip install -q --upgrade pip >>"$LOG" 2>&1 || true
# A C compiler and the Python headers build pykbroker/_native (the produce path's record walk).
command -v gcc >/dev/null || apt_install gcc libc6-dev
.venv/bin/python -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
    || apt_install python3-dev

if [ $WANT_TEST -eq 1 ]; then
    # kcat comes from Debian; Java for the Java client; Node for kafkajs.
    # ZooKeeper (Debian's 3.8 package) for the cluster tests, which start their own servers; libfaketime steps
    # a broker's wall clock (tests/support/faketime.py); libfuse2 (with fuse3's /dev/fuse) serves the
    # power-loss filesystem (tests/support/lazyfs.py, fusepy).
    apt_install kcat ca-certificates zookeeper libfaketime libfuse2
    # Prometheus and headless Chromium for the dashboard test (tests/integration/test_dashboard.py) and the web
    # console's browser tests (tests/console, driven by Playwright from the test extras, which never downloads
    # browsers of its own).
    apt_install prometheus chromium-headless-shell
    # The test starts its own Prometheus; Debian's package also enables a system one (port 9090): stop it.
    if [ -d /run/systemd/system ] && systemctl is-enabled prometheus >/dev/null 2>&1; then
        $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
    command -v javac >/dev/null || apt_install openjdk-17-jdk-headless
    # Maven fetches from Maven Central: Apache Kafka's jars for the compatibility suite (compat/kafka/pom.xml),
    # the Spark Kafka connector and the Java client (kafka-clients).
    command -v mvn >/dev/null || apt_install maven
    command -v node >/dev/null || apt_install nodejs npm
    # Go builds the Go client programs of the tests (tests/clients) and the compatibility suite's Go drivers
    # (compat/go) from the Go module proxy; their go.mod files need Go 1.26.
    go_toolchain
    pip_install -e '.[test,spark]'
else
    pip_install -e .
fi
.venv/bin/python -c 'import pykbroker, kio, anyio'
[ $WANT_TEST -eq 1 ] && spark_jars
mkdir -p "$STAMP_DIR"
echo "$HASH" >"$STAMP_DIR/$MODE"
# The test install includes the broker's, so a later scripts/run.sh need not install again.
if [ $WANT_TEST -eq 1 ]; then echo "$HASH" >"$STAMP_DIR/broker"; fi
