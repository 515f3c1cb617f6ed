#!/usr/bin/env bash
# The Debian 13 root the TFX 1.21 lane runs in on an older C library.
#
# TFX 1.21's ml-metadata and tensorflow-data-validation wheels need glibc
# >= 2.38 and GCC 13's libstdc++; Debian 12 and Ubuntu 22.04 have neither.
# This builds a minimal Debian 13 (trixie) root once, outside the clone, and
# runs commands in it with this machine's Python 3.11 and the clone bound in
# at their own paths, so a venv made inside works with the same paths.
#
#   debian13_root.sh build ROOT         build ROOT unless it is there and current
#   debian13_root.sh run ROOT CMD...    run CMD in ROOT, in the current folder
#
# Root only (debootstrap, chroot and bind mounts need it). The mounts live in
# a private mount namespace (unshare), so none outlives the command.
set -euo pipefail

# What the root holds beyond minbase: the C libraries the pyenv-built Python
# links, g++ (pyfarmhash builds from source), make to run the Makefile,
# iproute2 for the network-namespace test hosts, procps, git and the CA store.
PACKAGES="libffi8 libssl3t64 libsqlite3-0 zlib1g libbz2-1.0 liblzma5
  libreadline8t64 libncursesw6 libnsl2 libtirpc3t64 libuuid1 libexpat1
  ca-certificates g++ make iproute2 procps git"
# Bumped when what the root must hold changes; a root with another stamp is
# rebuilt.
STAMP="trixie-minbase-2 $(echo $PACKAGES | tr -s ' ')"
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

die() { echo "error: $*" >&2; exit 1; }

need_root() {
  [ "$(id -u)" = 0 ] || die "the Debian 13 root for TFX 1.21 needs root" \
    "(debootstrap, chroot); run as root, or on a machine with glibc >= 2.38" \
    "run TFX 1.21 natively."
}

build() {
  local root=$1
  need_root
  if [ -f "$root/.tfx-hpm-stamp" ] && \
     [ "$(cat "$root/.tfx-hpm-stamp")" = "$STAMP" ]; then
    return 0
  fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "debootstrap is not installed" \
      "and there is no apt-get to install it; install debootstrap."
    echo "Installing debootstrap (apt-get)..."
    apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null || \
      die "apt-get could not install debootstrap."
  fi
  echo "Building the Debian 13 root at $root (about a minute, once)..."
  local new="$root.new"
  rm -rf "$new"
  mkdir -p "$(dirname "$root")"
  debootstrap --variant=minbase trixie "$new" >"$new.log" 2>&1 || \
    die "debootstrap trixie failed; see $new.log"
  # The registries' TLS: this machine's CA bundle, named by the variables
  # pip and its build subprocesses read.
  mkdir -p "$new/etc/ssl/certs"
  cp "$CA_BUNDLE" "$new/etc/ssl/certs/host-ca-bundle.crt"
  run "$new" apt-get update -qq >>"$new.log" 2>&1 || \
    die "apt-get update in the root failed; see $new.log"
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive run "$new" apt-get install -y -qq \
    --no-install-recommends $PACKAGES >>"$new.log" 2>&1 || \
    die "apt-get install in the root failed; see $new.log"
  run "$new" apt-get clean
  echo "$STAMP" >"$new/.tfx-hpm-stamp"
  rm -rf "$root" "$new.log"
  mv "$new" "$root"
}

# The interpreter the lane uses, bound in at its own path (with pyenv's
# versions folder where it lives there).
python_home() {
  local python=${PYTHON:-}
  [ -n "$python" ] || return 0
  python=$(readlink -f "$(command -v "$python")")
  dirname "$(dirname "$python")"
}

run() {
  local root=$1; shift
  need_root
  [ -d "$root/usr" ] || die "no Debian 13 root at $root (build it first)."
  local here pyhome
  here=$(pwd -P)
  pyhome=$(python_home)
  # Inside the private namespace: /proc, /sys, /dev, /dev/shm and /run
  # fresh or bound; the interpreter and the current folder at their paths.
  unshare --mount --propagation private -- bash -c '
    set -e
    root=$1 here=$2 pyhome=$3; shift 3
    # The root a mount of its own, so "/" is a mount point inside (ip netns
    # exec remounts it).
    mount --bind "$root" "$root"
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs tmpfs "$root/run"
    mount -t tmpfs -o size=50% tmpfs "$root/dev/shm" 2>/dev/null || true
    if [ -n "$pyhome" ]; then
      mkdir -p "$root$pyhome" && mount --bind "$pyhome" "$root$pyhome"
    fi
    mkdir -p "$root$here" && mount --bind "$here" "$root$here"
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    cp /etc/hosts "$root/etc/hosts" 2>/dev/null || true
    cd "$root$here"
    exec chroot "$root" /usr/bin/env -C "$here" \
      PATH="${pyhome:+$pyhome/bin:}/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin" \
      HOME=/root \
      PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt \
      REQUESTS_CA_BUNDLE=/etc/ssl/certs/host-ca-bundle.crt \
      SSL_CERT_FILE=/etc/ssl/certs/host-ca-bundle.crt \
      TFX_HPM_DEBIAN13_ROOT="$root" \
      "$@"
  ' bash "$root" "$here" "$pyhome" "$@"
}

case "${1:-}" in
  build) [ $# = 2 ] || die "usage: $0 build ROOT"; build "$2" ;;
  run) [ $# -ge 3 ] || die "usage: $0 run ROOT CMD..."; root=$2; shift 2
       run "$root" "$@" ;;
  *) die "usage: $0 build ROOT | run ROOT CMD..." ;;
esac
