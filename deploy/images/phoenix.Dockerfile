# syntax=docker/dockerfile:1
# The trace UI: Arize Phoenix from PyPI, which receives OTLP over HTTP (/v1/traces) and serves a UI
# and a REST API on one port (6006). Jaeger is in neither Debian's packages nor PyPI.
# BASE_IMAGE: a Debian bookworm image (compose.yaml's BASE_IMAGE; without a registry, devtools/podman.py builds one).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
      && rm -rf /var/lib/apt/lists/*; fi \
 && groupadd --gid 10003 phoenix && useradd --uid 10003 --gid 10003 --create-home phoenix \
 && mkdir -p /phoenix && chown phoenix:phoenix /phoenix && python3 -m venv /opt/venv
# ca_bundle: an optional build secret (see the project's Dockerfile), never in a layer.
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && /opt/venv/bin/pip install --no-cache-dir 'arize-phoenix>=12,<21'
ENV PATH=/opt/venv/bin:$PATH PHOENIX_WORKING_DIR=/phoenix PHOENIX_HOST=0.0.0.0 PHOENIX_PORT=6006
USER phoenix
WORKDIR /phoenix
