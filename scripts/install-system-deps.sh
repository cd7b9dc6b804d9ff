#!/usr/bin/env bash
# Debian packages Lensemble needs beyond Python: Mesa's software EGL, through which MuJoCo draws
# the DMControl envs (swm/ReacherDMControl-v0) on a machine without a display or GPU
# (lensemble/envs/reacher.py selects MUJOCO_GL=egl). Installs only what is missing; run as root,
# or as a user with sudo. .ci/run calls it; the README's set-up does too.
set -euo pipefail
PACKAGES=(libegl1 libegl-mesa0 libgl1-mesa-dri)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "system packages: ${PACKAGES[*]} already installed"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "error: Debian packages missing (${missing[*]}) and no apt-get here: install a headless EGL" \
         "(Mesa) with your system's package manager, or OSMesa and set MUJOCO_GL=osmesa" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "error: installing ${missing[*]} needs root (apt-get)" >&2; exit 1; }
    SUDO="sudo"
fi
echo "system packages: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
