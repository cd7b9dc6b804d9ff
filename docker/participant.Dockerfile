# A participant site: flower-supernode. Each round it starts a flwr-clientapp process that trains
# on the site's shards (mounted at /data) and sends back only the pseudo-gradient, public-probe
# embeddings and scalar metrics.
# Build from the repository root:  docker build -f docker/participant.Dockerfile -t lensemble-participant .
# For a GPU site use a CUDA torch index, e.g. --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124
FROM python:3.11-slim

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    FLWR_HOME=/var/lib/flwr \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    SUPERLINK=coordinator:9092 \
    PARTITION_ID=0 \
    NUM_PARTITIONS=2

WORKDIR /opt/lensemble
COPY . .
RUN test -f README.md || echo "# Lensemble" > README.md \
 && pip install --index-url "$TORCH_INDEX" "torch>=2.5,<2.15" "torchvision>=0.20,<0.30" \
 && pip install .

# /certs/ca.crt: the CA that signed the coordinator's certificate. /keys/site: this site's EC
# private key (its .pub was registered by the operator). /data: this site's collection folder.
# /state: the inner optimizer state and DP ledger, kept across rounds and restarts.
VOLUME ["/certs", "/keys", "/data", "/state"]
ENTRYPOINT ["sh", "-c", "exec flower-supernode --superlink \"$SUPERLINK\" \
  --root-certificates /certs/ca.crt --auth-supernode-private-key /keys/site \
  --host 127.0.0.1 --port 9094 \
  --node-config \"partition-id=$PARTITION_ID num-partitions=$NUM_PARTITIONS data-path=\\\"/data\\\" state-dir=\\\"/state\\\"\""]
