#!/usr/bin/env bash
# The compose federation end to end on one host: start the coordinator, register both sites' keys,
# start the sites, submit a run from the host with `flwr run . compose --stream`, print what the
# run folder holds, and stop and remove every container and volume it started (KEEP=1 keeps them).
#
#   docker/run-demo.sh
#   OVERRIDES="experiment=micro federation.rounds=3" docker/run-demo.sh
#
# Needs: the images (docker/build-images.sh), docker/prepare.sh's files (made here if missing),
# docker compose v2 or docker-compose v1.29, and the flwr CLI (VENV/bin/flwr, else flwr on PATH).
# Environment: OVERRIDES (default "experiment=micro federation.rounds=2"; its data settings must
# match docker/prepare.sh's), RUN_NAME (default demo), VENV (default <repo>/.venv),
# APP_REF (a git ref: submit that commit's app instead of the working tree), KEEP=1, TAG.
set -euo pipefail

D="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$D/.." && pwd)"
OVERRIDES="${OVERRIDES:-experiment=micro federation.rounds=2}"
RUN_NAME="${RUN_NAME:-demo}"
VENV="${VENV:-$REPO/.venv}"
export TAG="${TAG:-latest}"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 FLWR_HOME="$D/operator"

if docker compose version >/dev/null 2>&1; then COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then COMPOSE=(docker-compose)
else echo "run-demo.sh: neither docker compose nor docker-compose" >&2; exit 1; fi
COMPOSE+=(-p lensemble -f "$D/compose.yaml")
FLWR="$VENV/bin/flwr"; [ -x "$FLWR" ] || FLWR="$(command -v flwr)" || { echo "run-demo.sh: no flwr CLI" >&2; exit 1; }

for role in coordinator participant; do
  docker image inspect "lensemble-$role:$TAG" >/dev/null 2>&1 || {
    echo "run-demo.sh: image lensemble-$role:$TAG missing: run docker/build-images.sh" >&2; exit 1; }
done
[ -f "$D/certs/server.pem" ] && [ -f "$D/keys/site1" ] && [ -f "$D/operator/config.toml" ] \
  || "$D/prepare.sh" certs keys operator
[ -f "$D/data/site0/collection.json" ] && [ -f "$D/data/site1/collection.json" ] || "$D/prepare.sh" data

WORK="$(mktemp -d "${TMPDIR:-/tmp}/lensemble-compose.XXXXXX")"
cleanup() {
  "${COMPOSE[@]}" logs --no-color > "$WORK/compose.log" 2>&1 || true
  if [ "${KEEP:-0}" = 1 ]; then echo "[demo] KEEP=1: containers left running (${COMPOSE[*]} down -v)"
  else "${COMPOSE[@]}" down -v --remove-orphans >/dev/null 2>&1 || true; fi
  echo "[demo] logs: $WORK/compose.log"
}
trap cleanup EXIT

t0=$(date +%s)
"${COMPOSE[@]}" up -d --no-build
# Both sites online? (`flwr supernode list` prints a table with one row per registered node.)
for _ in $(seq 90); do
  n="$("$FLWR" supernode list compose 2>/dev/null | grep -c -i online || true)"
  [ "$n" -ge 2 ] && break; sleep 2
done
"$FLWR" supernode list compose
echo "[demo] federation up in $(( $(date +%s) - t0 )) s"

# Submit from a clean copy of the app: flwr walks the whole app folder to build the FAB, and a
# .venv inside the checkout makes that slow (docs/deployment.md section 7).
mkdir -p "$WORK/app"
if [ -n "${APP_REF:-}" ]; then
  git -C "$REPO" archive "$APP_REF" pyproject.toml lensemble configs | tar -x -C "$WORK/app"
else
  cp "$REPO/pyproject.toml" "$WORK/app/"; cp -r "$REPO/lensemble" "$REPO/configs" "$WORK/app/"
fi
find "$WORK/app" -name __pycache__ -prune -exec rm -rf {} +
t1=$(date +%s)
(cd "$WORK/app" && "$FLWR" run . compose --stream \
  --run-config "overrides='$OVERRIDES' run-dir='/srv/lensemble/runs/$RUN_NAME'")
echo "[demo] flwr run finished in $(( $(date +%s) - t1 )) s"
"$FLWR" ls compose || true
"${COMPOSE[@]}" exec -T coordinator sh -c "ls /srv/lensemble/runs/$RUN_NAME; \
  python3 -c \"import json; s = json.load(open('/srv/lensemble/runs/$RUN_NAME/summary.json')); \
print({k: s[k] for k in s if k in ('rounds', 'rounds_completed', 'dropped', 'final_hash', 'participants')})\"" || true
