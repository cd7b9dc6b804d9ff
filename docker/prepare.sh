#!/usr/bin/env bash
# Make everything docker/compose.yaml mounts, for a one-host demo federation (docs/deployment.md,
# "Docker"): the same steps as sections 2-3 there, with names for the compose network.
#
#   docker/prepare.sh                          # certs, keys, operator config, data (experiment=micro)
#   OVERRIDES="experiment=micro" docker/prepare.sh data     # only one step: certs | keys | operator | data
#
# Creates (all git-ignored; never commit them):
#   docker/certs/{ca.crt,server.pem,server.key}   the SuperLink's TLS certificate, SAN
#                                                 DNS:coordinator (the sites), DNS:localhost and
#                                                 IP:127.0.0.1 (the operator on this host); the CA's
#                                                 private key is deleted once it has signed
#   docker/keys/{site0,site0.pub,site1,site1.pub} each site's EC P-384 node key (OpenSSH format)
#   docker/operator/config.toml                   the operator's flwr CLI connection "compose"
#                                                 (use with FLWR_HOME=docker/operator)
#   docker/data/{site0,site1}/                    each site's collection folder (collection.json at
#                                                 its top), collected inside the participant image
#                                                 with `lensemble data collect $OVERRIDES`
# Existing certs and keys are kept (FORCE=1 makes new ones); data is re-collected every time.
# Needs: openssl and ssh-keygen on the host; for "data", the lensemble-participant image.
# Environment: OVERRIDES (default experiment=micro; the run must use the same data settings),
# DOCKER (default docker), PARTICIPANT_IMAGE (default lensemble-participant:latest), SITES (default 2).
set -euo pipefail

D="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OVERRIDES="${OVERRIDES:-experiment=micro}"
DOCKER="${DOCKER:-docker}"
PARTICIPANT_IMAGE="${PARTICIPANT_IMAGE:-lensemble-participant:latest}"
SITES="${SITES:-2}"
FORCE="${FORCE:-0}"
steps=("$@"); [ ${#steps[@]} -gt 0 ] || steps=(certs keys operator data)

certs() {
  if [ -f "$D/certs/server.pem" ] && [ "$FORCE" != 1 ]; then echo "[prepare] certs: kept $D/certs"; return; fi
  mkdir -p "$D/certs"
  local tmp; tmp="$(mktemp -d)"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$tmp/ca.key" -out "$D/certs/ca.crt" -days 365 \
    -subj "/CN=lensemble-compose-ca" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout "$D/certs/server.key" -out "$tmp/server.csr" \
    -subj "/CN=coordinator" 2>/dev/null
  printf 'subjectAltName=DNS:coordinator,DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > "$tmp/server.ext"
  openssl x509 -req -in "$tmp/server.csr" -CA "$D/certs/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial \
    -CAserial "$tmp/ca.srl" -out "$D/certs/server.pem" -days 365 -extfile "$tmp/server.ext" 2>/dev/null
  rm -rf "$tmp"                            # the CA key: nothing else is ever signed with it
  chmod 644 "$D/certs/ca.crt" "$D/certs/server.pem"; chmod 600 "$D/certs/server.key"
  echo "[prepare] certs: $D/certs ($(openssl x509 -in "$D/certs/server.pem" -noout -ext subjectAltName | tail -1 | xargs))"
}

keys() {
  mkdir -p "$D/keys"
  for ((i = 0; i < SITES; i++)); do
    local k="$D/keys/site$i"
    if [ -f "$k" ] && [ "$FORCE" != 1 ]; then continue; fi
    rm -f "$k" "$k.pub"
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "site$i" -f "$k"
  done
  echo "[prepare] keys: $(cd "$D/keys" && ls | xargs)"
}

operator() {
  mkdir -p "$D/operator"
  cat > "$D/operator/config.toml" <<TOML
[superlink]
default = "compose"

[superlink.compose]
address = "127.0.0.1:9092"
root-certificates = "$D/certs/ca.crt"
TOML
  echo "[prepare] operator: FLWR_HOME=$D/operator (connection \"compose\" -> 127.0.0.1:9092)"
}

data() {
  # Collected once, inside the image the sites run (same library versions as the coordinator, so
  # the public probe hashes alike), then copied: each site gets its own folder.
  local tmp="$D/data/.collect"
  rm -rf "$tmp"; mkdir -p "$tmp"
  # shellcheck disable=SC2086
  "$DOCKER" run --rm --user "$(id -u):$(id -g)" -e HOME=/tmp -e MPLCONFIGDIR=/tmp \
    -e LENSEMBLE_CONFIG_DIR=/opt/lensemble/configs \
    -v "$D/data:/out" -w /out --entrypoint lensemble "$PARTICIPANT_IMAGE" \
    data collect $OVERRIDES data.root=/out/.collect
  local folder; folder="$(find "$tmp" -mindepth 1 -maxdepth 1 -type d | head -1)"
  [ -f "$folder/collection.json" ] || { echo "[prepare] data: no collection.json under $tmp" >&2; exit 1; }
  for ((i = 0; i < SITES; i++)); do
    rm -rf "$D/data/site$i"; cp -a "$folder" "$D/data/site$i"
  done
  rm -rf "$tmp"
  echo "[prepare] data: $(du -sh "$D/data/site0" | cut -f1) per site in $D/data/site{0..$((SITES - 1))} ($OVERRIDES)"
}

for s in "${steps[@]}"; do
  case "$s" in certs|keys|operator|data) "$s" ;; *) echo "prepare.sh: unknown step $s" >&2; exit 2 ;; esac
done
