# multinode: provision a cluster, run a data-parallel PyTorch job on it, destroy it.
#   make demo                                   set up, up, train across 2 local nodes, down
#   make up [PROVIDER=local|aws] [NODES=2] [SCHEDULER=slurm] [CLUSTER_TYPE=cpu|g4dn|g4ad] [REGION=.. SSH_CIDR=.. YES=1]
#   make train [TASK=multinode.yaml] [MODE=cpu|gpu|mpi|mpi-gpu] [NODES=2] [NPROC=1|auto] [SCRIPT=path|"-m pkg.mod"] [ARGS="..."] [LAUNCHER=static] [DRY_RUN=1] [QUEUE=1]
#              [WORKDIR=dir] [SETUP="pip install -r requirements.txt"] [ENV="HF_TOKEN EPOCHS=3"] [WORKDIR_LIMIT_MB=200]
#              [GRACE=seconds] [RESUME=1] [RECOVER=N] [RECOVER_WAIT=seconds]
#   make preempt NODE=1 [IN=s] [NOTICE=rebalance] a spot interruption notice (or rebalance) on a local node
#   make netcheck [NODES=n]                     the links (iperf3 matrix) and an all_reduce sweep, tables and a plot
#   make stacks [RUN=id]                        Python stacks of every rank of a running job, grouped
#   make down
#   make image IMAGE=cpu|cuda|rocm [TAG=...] [BUILD_ARGS="--build-arg ..."] [WHEEL_CACHE=dir] [PUSH=1 [CLUSTER=..|ECR=<acct>.dkr.ecr.<region>.amazonaws.com]]
# Variables become MULTINODE_<NAME> in the environment; the CLI reads them (flag > env > task file > default).
# Each is declared once (scripts/multinode/core/settings.py); scripts/settings.mk and docs/configuration.md's tables are
# generated from the declarations. A switch (DRY_RUN, QUEUE, YES, RESUME, SPOT) takes 1/0, yes/no or true/false.

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
# SCHEDULER=slurm: Debian 12's SLURM 22.05.8 and munge 0.5.15 (apt-cache policy slurmctld munge, 2026-11-23).
APT_PACKAGES += slurmctld slurmd slurm-client munge
# The bootstrap tests: shellcheck on the rendered user data, systemd-analyze on the TTL timer's calendar time.
APT_PACKAGES += shellcheck systemd
# tests/integration/test_errors_local.py cuts a node's link with iptables (here it came only through podman).
APT_PACKAGES += iptables
# tests/integration/test_ledger_local.py opens make report's page in a real headless browser (Debian 12's chromium,
# 156.0.8078.108 when installed here, 2026-11-25).
APT_PACKAGES += chromium
IMAGE_PACKAGES := buildah podman debootstrap runc
# The container tests: sudo (a non-root SSH user runs podman as root, as ubuntu has Docker's socket) and
# Debian's docker-registry (distribution 2.8.2, a real registry for make image PUSH=1).
IMAGE_PACKAGES += sudo docker-registry
IMAGES := cpu cuda rocm
IMAGE ?= cpu
TAG ?= multinode-$(IMAGE):latest
IMAGE_CONTEXT ?= docker
# Without a Docker engine (CI here): buildah, chroot isolation (no nested namespaces needed).
BUILDAH ?= buildah
# Images whose pinned wheels are fetched once per machine into WHEEL_CACHE (keyed by the pins) and
# installed from there with no index (multinode.images.wheelhouse); WHEEL_CACHE= lets pip read the index in the build.
WHEEL_CACHE ?= /var/tmp/multinode-images/wheels
WHEELHOUSE_IMAGES := cpu cuda

# Only what the user gave (`make train NODES=3`, or NODES in the environment), never the defaults above: a task
# file's `nodes: 3` must win over this file's NODES ?= 2 (docs/configuration.md, "Task file"). The CLI has the
# same defaults, so without a task file nothing changes.
given = $(if $(filter command line environment environment override,$(origin $(1))),$($(1)))
# Every setting's export (MULTINODE_<NAME>), generated from the declarations: python -m multinode.core.settings --write
include scripts/settings.mk

.PHONY: help setup demo up train down status logs report stacks netcheck preempt ssh test lint bench reap clean image

help: ## show this help
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'
	@echo "  variables (docs/configuration.md): $(SETTINGS)" | fold -s -w 118

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
	# Terraform and its AWS provider come from no registry we can reach: the tests use the machine's
	# terraform and the provider mirror (MULTINODE_TF_PLUGIN_MIRROR, default /opt/tf-plugins), and fail without them.
	@command -v terraform >/dev/null || echo "note: terraform >= 1.9 is not on PATH: PROVIDER=aws and the Terraform tests need it"
	@test -d "$${MULTINODE_TF_PLUGIN_MIRROR:-/opt/tf-plugins}/registry.terraform.io/hashicorp/aws" || echo "note: no AWS provider mirror at $${MULTINODE_TF_PLUGIN_MIRROR:-/opt/tf-plugins}: the Terraform tests need it"
	touch $@

demo: setup ## the whole loop on a laptop: up, train across 2 local nodes, down
	$(MAKE) --no-print-directory up NODES=2
	$(MAKE) --no-print-directory train NODES=2 || { status=$$?; $(MAKE) --no-print-directory down; exit $$status; }
	$(MAKE) --no-print-directory down

up: setup ## provision the cluster (PROVIDER=aws: REGION, SSH_CIDR, YES=1 to skip the cost prompt)
	$(MN) up

train: setup ## run the training job on the cluster
	$(MN) train

down: setup ## destroy the cluster and verify nothing is left (PROVIDER=aws YES=1: its ECR repository even with images)
	$(MN) down

status: setup ## show nodes and whether each answers SSH (and sinfo on a SLURM cluster)
	$(MN) status

logs: setup ## show the latest run's logs (RUN=id, NODE=i to narrow)
	$(MN) logs $(if $(RUN),--run $(RUN)) $(if $(NODE),--node $(NODE))

report: setup ## write a run's page (ledger, timeline per node, loss, step time per rank, throughput) and print its path (RUN=id)
	$(MN) report $(if $(RUN),--run $(RUN))

preempt: setup ## arm a spot notice on a local node's metadata endpoint (NODE=n, IN=seconds from now, NOTICE=interruption|rebalance)
	$(MN) preempt

netcheck: setup ## the network on demand: iperf3 matrix (1 and 4 flows) + an all_reduce sweep, tables and a plot (NODES=n)
	$(MN) netcheck

stacks: setup ## Python stacks of every rank of a running job, grouped (RUN=id to pick one); the job goes on
	$(MN) stacks $(if $(RUN),--run $(RUN))

ssh: setup ## open a shell on node NODE (default 0)
	$(MN) ssh $(or $(NODE),0)

reap: setup ## list leaked tagged instances in REGION (YES=1 terminates them)
	$(MN) reap

bench: setup ## benchmarks -> docs/benchmarks.{md,json} + plots; drills -> docs/reliability.md (QUICK=1: short, into bench/out)
	$(PY) -m bench $(if $(QUICK),--quick --out-dir bench/out)
	$(PY) -m bench.drills --out docs/reliability.md

image: ## build docker/IMAGE (cpu|cuda|rocm) as TAG; PUSH=1 also pushes it: to ECR=<registry>/TAG, else to the image CLUSTER runs, which every node then pulls
	$(if $(filter $(IMAGE),$(IMAGES)),,$(error IMAGE=$(IMAGE) is not an image; use IMAGE=cpu, IMAGE=cuda or IMAGE=rocm))
	$(if $(and $(PUSH),$(if $(ECR),,1)),$(eval PUSH_TO := $(shell $(PY) -m multinode.images.delivery target $(CLUSTER) $(IMAGE) 2>&1)))
	$(if $(filter error:,$(firstword $(PUSH_TO))),$(error PUSH=1: $(wordlist 2,999,$(PUSH_TO))))
	@set -eo pipefail; \
	if docker info >/dev/null 2>&1; then engine=docker; build="docker build"; \
	else engine="$(BUILDAH)"; build="$(BUILDAH) bud --isolation chroot --layers"; echo "no Docker engine: using buildah"; fi; \
	context="$(IMAGE_CONTEXT)"; \
	$(if $(and $(WHEEL_CACHE),$(filter $(IMAGE),$(WHEELHOUSE_IMAGES))),context=$$($(PY) -m multinode.images.wheelhouse $(IMAGE) $(IMAGE_CONTEXT) $(WHEEL_CACHE)); trap 'rm -rf "$$context"' EXIT; build="$$build --build-arg OFFLINE=1";) \
	echo "$$build $(IMAGE) -> $(TAG)"; \
	log=$$(mktemp /tmp/multinode-image-$(IMAGE)-XXXXXX.log); \
	$$build $(BUILD_ARGS) -f $$context/$(IMAGE)/Dockerfile -t $(TAG) $$context 2>&1 | $(PY) -m multinode.core.progress "image $(IMAGE)" "$$log"; \
	if [ -n "$(PUSH)" ]; then \
	  dest=$(if $(ECR),"$(ECR)/$(TAG)","$(PUSH_TO)"); registry=$${dest%%/*}; \
	  echo "push $(TAG) -> $$dest"; \
	  case "$$registry" in *.dkr.ecr.*.amazonaws.com) region=$$(echo "$$registry" | cut -d. -f4); \
	    aws ecr get-login-password --region "$$region" | $$engine login --username AWS --password-stdin "$$registry";; esac; \
	  $(if $(ECR),repo=$$(echo "$$dest" | cut -d/ -f2- | cut -d: -f1); aws ecr describe-repositories --region "$$region" --repository-names "$$repo" >/dev/null 2>&1 || aws ecr create-repository --region "$$region" --repository-name "$$repo" --image-scanning-configuration scanOnPush=true --encryption-configuration encryptionType=KMS >/dev/null;) \
	  $$engine tag $(TAG) "$$dest"; \
	  $$engine push "$$dest"; \
	  $(if $(ECR),echo "pushed $$dest; a cluster runs it with: make up ... IMAGE_REF=$$dest";,$(PY) -m multinode.images.delivery pull $(CLUSTER);) \
	fi

test: setup ## the whole test suite (unit + integration), as CI runs it
	# The checkout's packages by their repository names (an install maps training/ to multinode.trainer only).
	PYTHONPATH=scripts:. $(PY) -m pytest -q

lint: setup ## static checks: byte-compile everything, the import contracts (pyproject.toml), then the unit tests
	$(PY) -m compileall -q scripts training bench tests
	PYTHONPATH=scripts:. $(VENV)/bin/lint-imports
	$(PY) -m pytest -q tests/unit

clean: ## remove the venv (clusters must be down first)
	rm -rf $(VENV)
