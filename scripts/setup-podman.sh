#!/usr/bin/env bash
# Prepare this machine to build and run the pykbroker container image with
# podman (there is no Docker engine on the CI/developer machines).
#
#   sudo scripts/setup-podman.sh        # or as root; idempotent, fast on re-run
#
# It
#   1. installs podman and friends from Debian (only if something is missing),
#   2. installs podman-compose >= 1.6 from PyPI into its own venv
#      (/opt/pykbroker-podman-compose, linked as /usr/local/bin/podman-compose),
#   3. makes the base image docker.io/library/debian:bookworm-slim locally with
#      debootstrap from the Debian mirror apt uses (no image registry is
#      reachable here), unless podman already has that image.
#
# podman needs docker/containers.conf on these machines; the tests set it, by
# hand use:  export CONTAINERS_CONF=$PWD/docker/containers.conf
#
# Environment: DEBIAN_MIRROR / DEBIAN_SECURITY_MIRROR override the detected
# mirrors; PYKB_REBUILD_BASE=1 remakes the base image.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE_IMAGE=docker.io/library/debian:bookworm-slim
SUITE=bookworm
COMPOSE_VENV=/opt/pykbroker-podman-compose
COMPOSE_SPEC='podman-compose>=1.6,<2'
APT_PACKAGES=(podman buildah runc fuse-overlayfs slirp4netns uidmap debootstrap
              containernetworking-plugins golang-github-containernetworking-plugin-dnsname)

export CONTAINERS_CONF=${CONTAINERS_CONF:-$REPO_ROOT/docker/containers.conf}

log() { printf 'setup-podman: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (apt-get, podman storage in /var/lib/containers)"

# One run at a time (pytest-xdist workers or parallel CI steps may race).
exec 9>/var/lock/pykbroker-setup-podman.lock
flock -w 900 9 || die "timed out waiting for another setup-podman.sh"

# --- 1. Debian packages ----------------------------------------------------
missing=()
for p in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null
else
    log "Debian packages present"
fi
command -v podman >/dev/null || die "podman not on PATH after install"

# --- 2. podman-compose from PyPI (Debian's 1.0.3 is too old) --------------
compose_ok() {
    "$COMPOSE_VENV/bin/python" - <<'EOF' 2>/dev/null
import importlib.metadata as m, sys
v = tuple(int(x) for x in m.version("podman-compose").split(".")[:2])
sys.exit(0 if v >= (1, 6) else 1)
EOF
}
if ! compose_ok; then
    log "installing $COMPOSE_SPEC into $COMPOSE_VENV"
    rm -rf "$COMPOSE_VENV"
    python3 -m venv "$COMPOSE_VENV"
    "$COMPOSE_VENV/bin/pip" install -q "$COMPOSE_SPEC"
    compose_ok || die "podman-compose install failed"
else
    log "podman-compose present"
fi
ln -sf "$COMPOSE_VENV/bin/podman-compose" /usr/local/bin/podman-compose

# --- 3. the base image ------------------------------------------------------
# The first URI of the apt source that carries suite $1 (deb822 .sources files
# first, then one-line sources.list entries).
apt_uri_for_suite() {
    local suite=$1 f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -e "$f" ] || continue
        awk -v suite="$suite" 'BEGIN { RS = ""; FS = "\n" }
            {
                uris = ""; ok = 0
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^URIs:/)   { sub(/^URIs:[ \t]*/, "", $i); split($i, u, /[ \t]+/); uris = u[1] }
                    if ($i ~ /^Suites:/) { n = split($i, s, /[ \t]+/); for (j = 2; j <= n; j++) if (s[j] == suite) ok = 1 }
                    if ($i ~ /^Types:/ && $i !~ /(^|[ \t])deb([ \t]|$)/) { ok = -1 }
                }
                if (ok == 1 && uris != "") { print uris; exit }
            }' "$f"
    done | head -n1 | grep . && return 0
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk -v suite="$suite" '$1 == "deb" {
            i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
            if ($(i + 1) == suite) { print $i; exit } }' | head -n1 | grep .
}

if [ "${PYKB_REBUILD_BASE:-0}" = 1 ]; then
    podman rmi -f "$BASE_IMAGE" >/dev/null 2>&1 || true
fi
if podman image exists "$BASE_IMAGE"; then
    log "base image $BASE_IMAGE present"
else
    mirror=${DEBIAN_MIRROR:-$(apt_uri_for_suite "$SUITE" || echo http://deb.debian.org/debian)}
    security=${DEBIAN_SECURITY_MIRROR:-$(apt_uri_for_suite "$SUITE-security" || echo http://deb.debian.org/debian-security)}
    log "making $BASE_IMAGE with debootstrap from $mirror (security: $security)"
    work=$(mktemp -d /var/tmp/pykbroker-rootfs.XXXXXX)
    trap 'rm -rf "$work"' EXIT
    rootfs=$work/rootfs
    include=()
    case "$mirror$security" in *https:*) include=(--include=ca-certificates) ;; esac
    if ! debootstrap --variant=minbase "${include[@]}" "$SUITE" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1; then
        tail -n 30 "$work/debootstrap.log" >&2
        die "debootstrap failed"
    fi

    # Make it look like the official debian:bookworm-slim: deb822 sources with
    # updates and security, no docs/man/locales, apt lists and caches cleaned.
    rm -f "$rootfs/etc/apt/sources.list"
    cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
    cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    echo 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
    echo 'APT::AutoRemove::SuggestsImportant "false";' >"$rootfs/etc/apt/apt.conf.d/docker-autoremove-suggests"
    rm -rf "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
           "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* "$rootfs"/tmp/* \
           "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/lintian
    find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
    find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
    : >"$rootfs/etc/hostname"
    : >"$rootfs/etc/resolv.conf"

    tar --numeric-owner -C "$rootfs" -c . |
        podman import --quiet --change 'CMD ["bash"]' - "$BASE_IMAGE" >/dev/null
    rm -rf "$work"
    trap - EXIT
    podman image exists "$BASE_IMAGE" || die "import of $BASE_IMAGE failed"
    log "made $BASE_IMAGE"
fi

# A container must start with this containers.conf.
if ! out=$(podman run --rm --pull=never --network=none "$BASE_IMAGE" true 2>&1); then
    printf '%s\n' "$out" >&2
    die "podman cannot run $BASE_IMAGE (CONTAINERS_CONF=$CONTAINERS_CONF)"
fi
log "ready: podman $(podman --version | awk '{print $3}'), $("$COMPOSE_VENV/bin/podman-compose" --version 2>/dev/null | grep -i 'podman-compose' | head -n1)"
