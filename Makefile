# multinode: provision a cluster, run a data-parallel PyTorch job on it, destroy it.
#   make demo                                   set up, up, train across 2 local nodes, down
#   make up [PROVIDER=local|aws] [NODES=2] [CLUSTER_TYPE=cpu|g4dn|g4ad]
#   make train [MODE=cpu|gpu|mpi|mpi-gpu] [NODES=2] [NPROC=1] [SCRIPT=path] [ARGS="..."] [LAUNCHER=static] [DRY_RUN=1]
#   make down
# Variables become MULTINODE_<NAME> in the environment; the CLI reads them (flag > env > default).

SHELL := /bin/bash
.DEFAULT_GOAL := help

PROVIDER ?= local
NODES ?= 2
MODE ?= cpu
CLUSTER ?= dev
VENV := .venv
PY := $(VENV)/bin/python
MN := $(PY) -m multinode
STAMP := $(VENV)/.installed
APT_PACKAGES := openssh-server openmpi-bin libopenmpi-dev iproute2 iperf3 pdsh procps psmisc
IMAGE_PACKAGES := buildah podman debootstrap runc

export MULTINODE_PROVIDER := $(PROVIDER)
export MULTINODE_NODES := $(NODES)
export MULTINODE_MODE := $(MODE)
export MULTINODE_CLUSTER := $(CLUSTER)
export MULTINODE_NPROC := $(NPROC)
export MULTINODE_SCRIPT := $(SCRIPT)
export MULTINODE_ARGS := $(ARGS)
export MULTINODE_CLUSTER_TYPE := $(CLUSTER_TYPE)
export MULTINODE_MAX_RESTARTS := $(MAX_RESTARTS)
export MULTINODE_ELASTIC := $(ELASTIC)
export MULTINODE_RDZV_PORT := $(RDZV_PORT)
export MULTINODE_MTU := $(MTU)
export MULTINODE_NODE := $(NODE)
export MULTINODE_LAUNCHER := $(LAUNCHER)

.PHONY: help setup demo up train down status logs ssh test lint bench reap clean

help: ## show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'
	@echo "  variables: PROVIDER=$(PROVIDER) NODES=$(NODES) MODE=$(MODE) CLUSTER=$(CLUSTER) NPROC SCRIPT ARGS MAX_RESTARTS ELASTIC LAUNCHER DRY_RUN"

setup: $(STAMP) ## install system packages and the .venv (idempotent)

$(STAMP): pyproject.toml
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=$$(for p in $(APT_PACKAGES) $(IMAGE_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	  if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi; \
	else echo "not root: install these yourself if missing: $(APT_PACKAGES)"; fi
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# checkov pins older boto3/packaging: it gets its own venv.
	test -x $(VENV)/checkov/bin/checkov || (python3 -m venv $(VENV)/checkov && $(VENV)/checkov/bin/pip install -q 'checkov==3.3.30')
	touch $@

demo: setup ## the whole loop on a laptop: up, train across 2 local nodes, down
	$(MAKE) --no-print-directory up NODES=2
	$(MAKE) --no-print-directory train NODES=2 || { status=$$?; $(MAKE) --no-print-directory down; exit $$status; }
	$(MAKE) --no-print-directory down

up: setup ## provision the cluster
	$(MN) up

train: setup ## run the training job on the cluster
	$(MN) train $(if $(DRY_RUN),--dry-run)

down: setup ## destroy the cluster and verify nothing is left
	$(MN) down

status: setup ## show nodes and whether each answers SSH
	$(MN) status

logs: setup ## show the latest run's logs (RUN=id, NODE=i to narrow)
	$(MN) logs $(if $(RUN),--run $(RUN)) $(if $(NODE),--node $(NODE))

ssh: setup ## open a shell on node NODE (default 0)
	$(MN) ssh $(or $(NODE),0)

reap: setup ## list leaked tagged instances in REGION (YES=1 terminates them)
	$(MN) reap --region $(REGION) $(if $(YES),--yes)

bench: setup ## benchmarks -> docs/benchmarks.{md,json} + plots; drills -> docs/reliability.md (QUICK=1: short, into bench/out)
	$(PY) -m bench $(if $(QUICK),--quick --out-dir bench/out)
	$(PY) -m bench.drills --out docs/reliability.md

test: setup ## the whole test suite (unit + integration), as CI runs it
	$(PY) -m pytest -q

lint: setup ## static checks: byte-compile everything, then the unit tests
	$(PY) -m compileall -q scripts training bench tests
	$(PY) -m pytest -q tests/unit

clean: ## remove the venv (clusters must be down first)
	rm -rf $(VENV)
