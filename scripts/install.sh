#!/usr/bin/env bash
# Installs what pykbroker needs on a fresh Debian machine (run as root, or with sudo available).
#   scripts/install.sh          # the broker: Python, a virtualenv in .venv, the package
#   scripts/install.sh --test   # plus everything the test suites use
set -euo pipefail
cd "$(dirname "$0")/.."
WANT_TEST=0
[ "${1:-}" = "--test" ] && WANT_TEST=1

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
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true

if [ $WANT_TEST -eq 1 ]; then
    # kcat and ZooKeeper come from Debian; Java for the Java client; Node for kafkajs.
    apt_install kcat zookeeper ca-certificates
    command -v javac >/dev/null || apt_install openjdk-17-jdk-headless
    command -v node >/dev/null || apt_install nodejs npm
    .venv/bin/pip install -q -e '.[test,spark]'
else
    .venv/bin/pip install -q -e .
fi
.venv/bin/python -c 'import pykbroker, kio, anyio' 
