#!/usr/bin/env bash
# Two sites and a coordinator on this machine, talking Flower over 127.0.0.1 with TLS and
# node authentication: the same commands as a real deployment (docs/deployment.md), minus the
# network. Runs `federation.rounds` DiLoCo rounds and leaves the run folder in $WORK/run.
#
#   examples/two_site_loopback.sh                      # experiment=micro
#   OVERRIDES="experiment=micro federation.rounds=3" examples/two_site_loopback.sh
#
# Needs: the project installed in a venv (VENV, default ./.venv), openssl, ssh-keygen.
# Everything this script starts is stopped by PID when it exits.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$REPO/.venv}"
WORK="${WORK:-$(mktemp -d /tmp/lensemble-loopback.XXXXXX)}"
LINK_PORT="${LINK_PORT:-9092}"
OVERRIDES="${OVERRIDES:-experiment=micro}"

export PATH="$VENV/bin:$PATH"                # flwr spawns flwr-serverapp / flwr-clientapp by name
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
mkdir -p "$WORK"/{certs,keys,link,cli,site0,site1,state0,state1}
echo "work folder: $WORK"

PIDS=()
cleanup() {
  # the Flower processes we started, and their direct children (each starts a flower-superexec)
  local all=()
  for pid in "${PIDS[@]}"; do all+=("$pid" $(pgrep -P "$pid" || true)); done
  for pid in "${all[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# 1. TLS: a private CA and a SuperLink certificate whose SAN names the address the sites dial.
cd "$WORK/certs"
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj "/CN=lensemble-ca" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=127.0.0.1" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.pem -days 30 \
  -extfile server.ext 2>/dev/null

# 2. One EC key pair per site (OpenSSH format). Sites keep the private key; the operator registers
#    the public key.
for s in site0 site1; do ssh-keygen -q -t ecdsa -b 384 -N "" -C "$s" -f "$WORK/keys/$s"; done

# 3. The coordinator: one port serves the Fleet (sites), Control (flwr CLI) and Runtime APIs.
#    Each process starts in its own folder, so relative paths (data.root) stay inside $WORK.
cd "$WORK/link"
FLWR_HOME="$WORK/link" flower-superlink --host 127.0.0.1 --port "$LINK_PORT" \
  --ssl-ca-certfile "$WORK/certs/ca.crt" --ssl-certfile "$WORK/certs/server.pem" \
  --ssl-keyfile "$WORK/certs/server.key" --enable-supernode-auth \
  --disable-runtime-dependency-installation --database "$WORK/link/state.db" \
  > "$WORK/link/superlink.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 60); do (echo > "/dev/tcp/127.0.0.1/$LINK_PORT") 2>/dev/null && break; sleep 1; done

# 4. The operator's CLI connection, then register both sites' public keys.
cat > "$WORK/cli/config.toml" <<TOML
[superlink]
default = "loopback"

[superlink.loopback]
address = "127.0.0.1:$LINK_PORT"
root-certificates = "$WORK/certs/ca.crt"
TOML
for s in site0 site1; do FLWR_HOME="$WORK/cli" flwr supernode register "$WORK/keys/$s.pub" loopback; done

# 5. The sites: each names its silo (partition-id) and where its local training state persists
#    (state-dir). Real sites also pass data-path="/their/collection"; on one machine each site
#    re-creates its simulated silo from the run's config instead.
for i in 0 1; do
  cd "$WORK/site$i"
  FLWR_HOME="$WORK/site$i" flower-supernode --superlink "127.0.0.1:$LINK_PORT" \
    --root-certificates "$WORK/certs/ca.crt" --auth-supernode-private-key "$WORK/keys/site$i" \
    --host 127.0.0.1 --port "$((9094 + i))" \
    --node-config "partition-id=$i num-partitions=2 state-dir=\"$WORK/state$i\"" \
    > "$WORK/site$i/supernode.log" 2>&1 &
  PIDS+=($!)
done

# 6. Submit the run from a clean copy of the app (flwr builds the FAB by walking the app folder;
#    a .venv inside the checkout would make that slow) and stream its logs until it ends.
mkdir -p "$WORK/app"
cp "$REPO/pyproject.toml" "$WORK/app/"
cp -r "$REPO/lensemble" "$REPO/configs" "$WORK/app/"
find "$WORK/app" -name __pycache__ -prune -exec rm -rf {} +
cd "$WORK/app"
FLWR_HOME="$WORK/cli" flwr run . loopback --stream \
  --run-config "overrides='$OVERRIDES' run-dir='$WORK/run'"

echo "run folder: $WORK/run"
ls "$WORK/run"
