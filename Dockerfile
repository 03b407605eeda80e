FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY worker ./worker
COPY tasks ./tasks
COPY scripts ./scripts
RUN pip install --no-cache-dir '.[monitor]' && useradd --create-home agent && mkdir -p /homes && chown agent /homes
USER agent
ENV AGENT_HOMES_ROOT=/homes
