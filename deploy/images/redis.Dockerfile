# Redis from Debian's packages (compose's `redis` service; docs/deployment.md "Redis").
# BASE_IMAGE: a Debian bookworm image (compose.yaml's BASE_IMAGE; without a registry, devtools/podman.py builds one).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# A fixed uid, so an operator can give it a data directory of its own on the host (chown 10002).
RUN groupadd --system --gid 10002 redis \
 && useradd --system --uid 10002 --gid redis --home-dir /data --no-create-home --shell /usr/sbin/nologin redis \
 && apt-get update && apt-get install -y --no-install-recommends redis-server redis-tools \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /data && chown redis:redis /data
USER redis
WORKDIR /data
