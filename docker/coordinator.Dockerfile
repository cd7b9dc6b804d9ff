# The coordinator: flower-superlink. The ServerApp (the DiLoCo round loop, checkpoints, metrics)
# runs inside it in a flwr-serverapp subprocess, so this image carries Lensemble and torch too.
# Build from the repository root:  docker build -f docker/coordinator.Dockerfile -t lensemble-coordinator .
FROM python:3.11-slim

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    FLWR_HOME=/var/lib/flwr \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/lensemble
# coordinator.Dockerfile.dockerignore lets only pyproject.toml, README.md, lensemble/, configs/ in.
COPY . .
RUN test -f README.md || echo "# Lensemble" > README.md \
 && pip install --index-url "$TORCH_INDEX" "torch>=2.5,<2.15" "torchvision>=0.20,<0.30" \
 && pip install .

# Certificates (ca.crt, server.pem, server.key) and persistent state (SuperLink database with the
# registered node keys, run folders) come from volumes.
VOLUME ["/certs", "/srv/lensemble"]
EXPOSE 9092
ENTRYPOINT ["flower-superlink", "--host", "0.0.0.0", "--port", "9092", \
            "--ssl-ca-certfile", "/certs/ca.crt", "--ssl-certfile", "/certs/server.pem", \
            "--ssl-keyfile", "/certs/server.key", "--enable-supernode-auth", \
            "--disable-runtime-dependency-installation", "--database", "/srv/lensemble/superlink.db"]
