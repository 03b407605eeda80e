# Prometheus from Debian's packages (compose's `prometheus` service).
# BASE_IMAGE: a Debian bookworm image (compose.yaml's BASE_IMAGE; without a registry, devtools/podman.py builds one).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
USER prometheus
WORKDIR /prometheus
