#!/usr/bin/env bash
# Fill docker/wheels/ with every wheel the images need (torch CPU build included), so the image
# builds install with `pip --no-index` and need no network: for hosts that reach a package index
# but whose containers should not (or cannot), and for air-gapped sites (fetch on a connected
# machine, carry docker/wheels/ over).
#
#   docker/fetch-wheels.sh                                   # torch from the PyTorch CPU index
#   TORCH="torch==2.13.0+cpu torchvision==0.28.0" TORCH_INDEX= docker/fetch-wheels.sh
#                                                            # torch from pip's own sources (find-links)
#
# Environment:
#   PYTHON=python3     a Python 3.11 (the images' Python: bookworm's python3 or python:3.11-slim)
#   TORCH="torch torchvision"  requirement specifiers for torch; pin a +cpu build when pip's sources
#                      also hold CUDA builds
#   TORCH_INDEX=https://download.pytorch.org/whl/cpu   extra index for torch ("" for none)
#   WHEELS=docker/wheels           emptied of *.whl first, so it holds exactly one resolve
#   ALLOW_CUDA=1       accept a CUDA torch build (several GB of nvidia-* wheels; runs on CPU too)
# Without a wheelhouse the Dockerfiles install from the network instead (PyPI + TORCH_INDEX).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
TORCH="${TORCH:-torch torchvision}"
TORCH_INDEX="${TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
WHEELS="${WHEELS:-$REPO/docker/wheels}"

ver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ "$ver" = 3.11 ] || { echo "fetch-wheels.sh: $PYTHON is Python $ver; the images run 3.11 (cp311 wheels)" >&2; exit 1; }

extra=()
[ -n "$TORCH_INDEX" ] && extra=(--extra-index-url "$TORCH_INDEX")
mkdir -p "$WHEELS"
rm -f "$WHEELS"/*.whl
# One resolve for the project, torch and the build backend, so torch is the pinned build and
# `pip install .` inside the image finds setuptools/wheel for its isolated build.
# shellcheck disable=SC2086
"$PYTHON" -m pip wheel --wheel-dir "$WHEELS" "${extra[@]}" "$REPO" $TORCH "setuptools>=68" wheel
rm -f "$WHEELS"/lensemble-*.whl          # the images build Lensemble from the copied sources

if [ "${ALLOW_CUDA:-0}" != 1 ] && ls "$WHEELS" | grep -E '^nvidia_|^triton-|^cuda_' >/dev/null; then
  echo "fetch-wheels.sh: CUDA wheels in $WHEELS (torch resolved to a CUDA build): pin TORCH to a +cpu build, or ALLOW_CUDA=1" >&2
  exit 1
fi
echo "$(ls "$WHEELS"/*.whl | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1) in $WHEELS"
