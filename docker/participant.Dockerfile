# A participant site: flower-supernode. Each round it starts a flwr-clientapp process that trains
# on the site's shards (mounted at /data) and sends back only the pseudo-gradient, public-probe
# embeddings and scalar metrics.
#
# Build from the repository root, with BuildKit (it reads participant.Dockerfile.dockerignore, so
# only pyproject.toml, README.md, lensemble/, configs/ and docker/wheels/ are sent):
#   DOCKER_BUILDKIT=1 docker build -f docker/participant.Dockerfile -t lensemble-participant .
# Build arguments:
#   BASE_IMAGE   a Debian-like image with python3 (3.11) and its venv module. Default: the official
#                python:3.11-slim. Without a registry: docker/build-base.sh -> lensemble-base:local
#   TORCH_INDEX  where torch comes from when docker/wheels/ holds no wheels: the PyTorch CPU index by
#                default; a GPU site uses a CUDA index, e.g. https://download.pytorch.org/whl/cu124
# With wheels in docker/wheels/ (docker/fetch-wheels.sh) everything installs from them, offline.
# Everything up to the ENV below is identical in coordinator.Dockerfile: the two images share those layers.
ARG BASE_IMAGE=python:3.11-slim

# Stage "deps": a venv with every dependency and no Lensemble, so its layer is the same in both
# images (stored once) and survives code changes. The wheelhouse is bind-mounted, not copied: no
# layer keeps the wheels.
FROM ${BASE_IMAGE} AS deps
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml /tmp/pyproject.toml
RUN --mount=type=bind,source=docker/wheels,target=/wheels \
    python3 -m venv /opt/venv \
 && python3 -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && if ls /wheels/*.whl >/dev/null 2>&1; then \
      /opt/venv/bin/pip install --no-index --find-links /wheels -r /tmp/requirements.txt "setuptools>=68" wheel; \
    else \
      /opt/venv/bin/pip install --index-url "$TORCH_INDEX" "torch>=2.5,<2.15" "torchvision>=0.20,<0.30" \
      && /opt/venv/bin/pip install -r /tmp/requirements.txt "setuptools>=68" wheel; \
    fi \
 && rm /tmp/requirements.txt

FROM ${BASE_IMAGE}
COPY --from=deps /opt/venv /opt/venv
# Lensemble itself (a small layer). /opt/lensemble/configs also serves the `lensemble` CLI in this
# image (LENSEMBLE_CONFIG_DIR=/opt/lensemble/configs, as docker/prepare.sh sets it for `lensemble
# data collect`); it is not set here because the ServerApp and ClientApp compose from the configs/
# of the FAB each run ships, which that variable would override.
WORKDIR /opt/lensemble
COPY pyproject.toml README.md ./
COPY lensemble/ lensemble/
COPY configs/ configs/
RUN PIP_NO_CACHE_DIR=1 /opt/venv/bin/pip install --no-deps --no-build-isolation --disable-pip-version-check . \
 && /opt/venv/bin/pip check \
 && /opt/venv/bin/python -c "import torch, torchvision, flwr, lensemble; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'flwr', flwr.__version__)" \
 && rm -rf build lensemble.egg-info
ENV PATH=/opt/venv/bin:$PATH \
    FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    FLWR_HOME=/var/lib/flwr \
    PYTHONUNBUFFERED=1 \
    SUPERLINK=coordinator:9092 \
    PARTITION_ID=0 \
    NUM_PARTITIONS=2
WORKDIR /state

# /certs/ca.crt: the CA that signed the coordinator's certificate. /keys/site: this site's EC
# private key (its .pub was registered by the operator). /data: this site's collection folder
# (collection.json at its top). /state: the inner optimizer state and DP ledger, kept across
# rounds and restarts.
VOLUME ["/certs", "/keys", "/data", "/state"]
ENTRYPOINT ["sh", "-c", "exec flower-supernode --superlink \"$SUPERLINK\" \
  --root-certificates /certs/ca.crt --auth-supernode-private-key /keys/site \
  --host 127.0.0.1 --port 9094 \
  --node-config \"partition-id=$PARTITION_ID num-partitions=$NUM_PARTITIONS data-path=\\\"/data\\\" state-dir=\\\"/state\\\"\""]
