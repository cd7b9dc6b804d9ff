#!/usr/bin/env bash
# Build a local base image for the Lensemble Dockerfiles from Debian's own packages, for hosts that
# can reach a Debian mirror but no container registry (so `FROM python:3.11-slim` cannot be pulled).
#
#   sudo docker/build-base.sh                       # -> image lensemble-base:local
#   docker build --build-arg BASE_IMAGE=lensemble-base:local -f docker/participant.Dockerfile ...
#
# What it makes: a minimal Debian (debootstrap --variant=minbase) with python3 (3.11 on bookworm),
# python3-venv, python3-pip, openssl and ca-certificates, imported with `docker import`. The image
# has no pip-installed packages: the Dockerfiles install into their own venv (/opt/venv), which
# works the same on this base and on the official python image.
#
# Environment (all optional):
#   SUITE=bookworm                 Debian release; bookworm ships Python 3.11 (the wheels are cp311)
#   MIRROR=http://deb.debian.org/debian
#   TAG=lensemble-base:local       the image tag
#   SCRATCH=<mktemp -d>            where the root file system is assembled (~250 MB); removed at the end
#   KEEP_ROOTFS=1                  keep $SCRATCH for inspection
# Needs: root, debootstrap, a running Docker daemon. Takes ~2-4 min on 2 cores.
set -euo pipefail

SUITE="${SUITE:-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
TAG="${TAG:-lensemble-base:local}"
SCRATCH="${SCRATCH:-$(mktemp -d "${TMPDIR:-/var/tmp}/lensemble-base.XXXXXX")}"
ROOTFS="$SCRATCH/rootfs"
PACKAGES="python3,python3-venv,python3-pip,openssl,ca-certificates"

[ "$(id -u)" = 0 ] || { echo "build-base.sh: debootstrap needs root" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "build-base.sh: apt-get install debootstrap" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "build-base.sh: no Docker daemon reachable" >&2; exit 1; }

cleanup() {
  # debootstrap may leave /proc and /sys mounted inside the root fs after a failure
  for m in proc sys dev/pts dev; do mountpoint -q "$ROOTFS/$m" 2>/dev/null && umount -l "$ROOTFS/$m" || true; done
  [ "${KEEP_ROOTFS:-0}" = 1 ] || rm -rf "$SCRATCH"
}
trap cleanup EXIT

echo "[build-base] debootstrap $SUITE from $MIRROR into $ROOTFS"
nice -n 10 debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR"

# Slim it: package lists and caches, docs, man pages (the same things the official slim images drop).
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb \
       "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* \
       "$ROOTFS"/var/log/*.log "$ROOTFS"/var/cache/debconf/*-old
# The archive the image should use for later apt-get calls (debootstrap writes only the mirror line).
printf 'deb %s %s main\n' "$MIRROR" "$SUITE" > "$ROOTFS/etc/apt/sources.list"
chroot "$ROOTFS" python3 -c 'import sys, venv, ssl; print("[build-base] python", sys.version.split()[0], ssl.OPENSSL_VERSION)'

echo "[build-base] docker import -> $TAG"
tar --numeric-owner -C "$ROOTFS" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["python3"]' \
  --message "lensemble base: debootstrap $SUITE minbase + $PACKAGES" \
  - "$TAG"
docker image ls "$TAG"
