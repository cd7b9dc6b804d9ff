#!/usr/bin/env bash
# Build lensemble-coordinator and lensemble-participant from the repository root with BuildKit.
#
#   docker/build-images.sh                                   # FROM python:3.11-slim (needs a registry)
#   BASE_IMAGE=lensemble-base:local docker/build-images.sh   # FROM the base of docker/build-base.sh
#
# BuildKit matters: only it reads docker/<name>.Dockerfile.dockerignore, which limits the context
# to pyproject.toml, README.md, lensemble/, configs/ and docker/wheels/. The legacy builder would
# send the whole checkout (a .venv inside it is gigabytes). Docker CLIs >= 23 need the buildx
# plugin for BuildKit; older ones (Debian bookworm's docker.io 20.10) take DOCKER_BUILDKIT=1.
#
# Environment: BASE_IMAGE, TORCH_INDEX (build args), TAG (default latest), DOCKER (the CLI),
# NICE (default 10: builds run under `nice -n $NICE`).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE_IMAGE="${BASE_IMAGE:-python:3.11-slim}"
TAG="${TAG:-latest}"
NICE="${NICE:-10}"
args=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
[ -n "${TORCH_INDEX:-}" ] && args+=(--build-arg "TORCH_INDEX=$TORCH_INDEX")

# A CLI that builds with BuildKit: one with buildx, else a pre-23 one with DOCKER_BUILDKIT=1.
buildkit_cli() {
  local cli="$1" major
  command -v "$cli" >/dev/null || return 1
  if "$cli" buildx version >/dev/null 2>&1; then echo "$cli"; return 0; fi
  major="$("$cli" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)"
  [[ "$major" =~ ^[0-9]+$ ]] && [ "$major" -lt 23 ] && { echo "$cli"; return 0; }
  return 1
}
if [ -n "${DOCKER:-}" ]; then
  CLI="$(buildkit_cli "$DOCKER")" || { echo "build-images.sh: $DOCKER cannot build with BuildKit" >&2; exit 1; }
else
  CLI="$(buildkit_cli docker || buildkit_cli /usr/bin/docker)" || {
    echo "build-images.sh: no Docker CLI with BuildKit (install docker-buildx, or set DOCKER=)" >&2; exit 1; }
fi
export DOCKER_BUILDKIT=1
echo "[build-images] CLI $CLI ($("$CLI" version --format '{{.Client.Version}}')), BASE_IMAGE=$BASE_IMAGE," \
     "$(ls "$REPO"/docker/wheels/*.whl 2>/dev/null | wc -l) wheels in docker/wheels"

cd "$REPO"
for role in coordinator participant; do
  start=$(date +%s)
  nice -n "$NICE" "$CLI" build --progress=plain "${args[@]}" -f "docker/$role.Dockerfile" -t "lensemble-$role:$TAG" .
  echo "[build-images] lensemble-$role:$TAG built in $(( $(date +%s) - start )) s"
done
"$CLI" image ls --filter "reference=lensemble-*"
