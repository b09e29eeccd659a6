# Make targets are a contract: users, CI (.ci/run -> make test) and reviewers call them.
# Each target installs what it needs, so a fresh machine needs nothing else.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV    ?= .venv
PY      := $(VENV)/bin/python
UV      := $(VENV)/bin/uv
CLUSTER := $(PY) tests/cluster/controlplane.py
PYTEST_ARGS ?=

.PHONY: images images-platforms test-images test-platforms images-prune release mirror bundle
.PHONY: help deps install lock binaries binaries-core node-deps node-images cluster-up cluster-down test test-unit test-integration \
        demo demo-down demo-kwok bench bench-engine crds lint clean supported-configs

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

install: $(VENV)/.installed ## Create .venv with the operator, the engine extra and test tools

$(VENV)/.installed: pyproject.toml requirements.lock
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check "$$(grep -o '^uv==[^ ]*' requirements.lock)"
	# Exactly the lock's versions (hash-checked); sync removes whatever the lock does not list.
	# Compiled to bytecode now (~1.5 min): with PYTHONDONTWRITEBYTECODE set (as on the CI
	# machine) nothing writes it later, and every process compiled what it imported from
	# source; an engine start on CPU took 79 s of CPU instead of 24 s (vLLM's imports).
	$(UV) pip sync --compile-bytecode --python $(PY) requirements.lock
	$(UV) pip install --python $(PY) --no-deps -e .
	touch $@

# The lock: pyproject.toml's dependencies with the engine and test extras, pip and uv (the tools
# `make install` runs), for the dev machines' Linux x86_64 and python3.11. It leaves out
# torchvision/torchaudio/torchcodec (--excludes): linked against CUDA torch, they break `import
# transformers` next to the torch vLLM pins; the engine needs none of them. The pins already
# in requirements.lock are kept where they still fit: LOCK_ARGS=--upgrade for the newest ones.
# operator/requirements.lock, what the operator image installs: pyproject.toml's dependencies
# alone at requirements.lock's versions (what the tests ran), resolved for every platform (the
# image's four architectures), every file's hash.
lock: install ## Regenerate requirements.lock (make install's versions) and operator/requirements.lock from pyproject.toml
	printf 'pip\nuv\n' | $(UV) pip compile pyproject.toml - --extra engine --extra test \
		--excludes <(printf 'torchvision\ntorchaudio\ntorchcodec\n') \
		--python-version 3.11 --python-platform x86_64-unknown-linux-gnu --generate-hashes \
		--custom-compile-command 'make lock' --quiet -o requirements.lock $(LOCK_ARGS)
	$(UV) pip compile pyproject.toml --universal --python-version 3.11 --generate-hashes \
		-c <(sed -n 's/^\([A-Za-z0-9_.-]*==[^ ;]*\).*/\1/p' requirements.lock) \
		--no-annotate --custom-compile-command 'make lock' --quiet -o operator/requirements.lock

binaries: binaries-core ## Build (or reuse) the pinned control-plane binaries, prometheus-adapter and KEDA too (cache outside the repo)
	tests/cluster/metrics-deps.sh >/dev/null
	tests/cluster/keda-deps.sh >/dev/null

# What every cluster session needs. prometheus-adapter (~1.5 min cold, the autoscaling tests)
# and KEDA (~7 min cold, the scale-to-zero tests) are not in it: `make test` builds them in the
# background while the tests run (tests/streams.py) and the tests that use them wait for that
# build or build them themselves (metrics-deps.sh and keda-deps.sh hold a lock).
binaries-core: node-deps
	tests/cluster/build.sh
	tests/cluster/metrics-deps.sh --prometheus-only
	tests/cluster/registry-deps.sh >/dev/null
	tests/cluster/helm3-deps.sh >/dev/null
	tests/cluster/crds.sh >/dev/null
	tests/cluster/dra-deps.sh >/dev/null
	tests/cluster/supplychain-deps.sh >/dev/null

cluster-up: install binaries ## Start the local control plane (SPYRE_REAL_NODE=1: with the real node)
	$(CLUSTER) up

cluster-down: ## Stop the local control plane (the demos with it); leaves no process behind
	@if [ -f .cluster/operator-demo.pid ]; then kill $$(cat .cluster/operator-demo.pid) 2>/dev/null || true; rm -f .cluster/operator-demo.pid; fi
	@if [ -x $(PY) ]; then $(CLUSTER) down; else echo "no venv, nothing to stop"; fi

crds: install ## Regenerate the CRD YAML, docs/api.md and the reasons table from the code
	$(PY) -m spyre_operator.cli crd > crds/serving.spyre.dev_spyremodels.yaml
	cp crds/serving.spyre.dev_spyremodels.yaml charts/spyre-model-operator/files/crd-spyremodels.yaml
	$(PY) -m spyre_operator.cli api-doc > docs/api.md
	$(PY) -m spyre_operator.cli reasons-doc docs/troubleshooting.md

supported-configs: install ## Copy the installed plugin's model_configs.yaml into the operator (after a sendnn-inference bump)
	$(PY) -c "import importlib.metadata as m, pathlib, sendnn_inference as s; \
	v = m.version('sendnn-inference'); \
	src = pathlib.Path(s.__file__).parent / 'config' / 'model_configs.yaml'; \
	dst = pathlib.Path('operator/spyre_operator/data/model_configs.yaml'); \
	head = dst.read_text().splitlines(keepends=True)[:5]; \
	head[0] = f'# sendnn-inference {v}: ' + head[0].split(': ', 1)[1]; \
	dst.write_text(''.join(head) + src.read_text())"
	sed -i 's/^SUPPORTED_CONFIGS_VERSION = .*/SUPPORTED_CONFIGS_VERSION = "sendnn-inference $(shell $(PY) -c "import importlib.metadata as m; print(m.version(\"sendnn-inference\"))")"/' operator/spyre_operator/desired/shapes.py

lint: install ## ruff + mypy
	$(VENV)/bin/ruff check operator engine tests
	$(VENV)/bin/mypy operator/spyre_operator

deps: ## install + binaries + the host's images, in parallel (pip downloads and images overlap the Go build)
	# Cold on 2 cores: the Go builds ~12 min without KEDA and prometheus-adapter (they keep
	# both cores busy), the images ~9.7 min beside them. The adapter (~1.5 min) and KEDA
	# (~7 min) are not here: `make test` builds them in the background at the lowest CPU and
	# I/O priority while its sessions run (tests/streams.py); `make demo
	# DEMO_ARGS=--scale-to-zero` builds KEDA when it starts it. The operator image's other
	# architectures (images-platforms, ~15 min of qemu cold) are for `make release` and `make
	# test-platforms` only.
	# The images then go into the real node's containerd (node-images) while the Go builds run:
	# the first real-node test no longer waits for the engine's 9 GB (2-6 min cold).
	$(MAKE) --no-print-directory -j2 binaries-core node-images

node-deps: ## The Debian packages the real node runs on (containerd, runc, CNI plugins, ...)
	tests/cluster/node-deps.sh

node-images: images node-deps ## Import the images into the real node's containerd (before it starts)
	$(PY) tests/cluster/controlplane.py prime-images

images: install ## Build (or reuse) the operator and engine images (docker-archives in ~/.cache/spyre-model-operator/images)
	tests/images/build.sh all >/dev/null

# The operator image for the release's other architectures, built under qemu-user-static (Debian's
# package, registered with binfmt_misc): cold ~4 min (arm64) to ~6.5 min (s390x, ppc64le: a C
# compiler builds msgspec) each, cached like the others.
images-platforms: images ## The operator image for arm64, ppc64le and s390x too (under qemu-user-static)
	tests/images/build.sh platforms >/dev/null

test-images: install ## Build (or reuse) the images and run them as their pods would, without Kubernetes
	$(PY) -m pytest -m images tests/integration/test_images.py $(PYTEST_ARGS)

# Not in `make test` (CI's budget, issue 43): the qemu builds take ~12 min per architecture cold.
# Once per change of what decides it (tests/images/build.py platforms_key): a pass is recorded
# under ~/.cache/spyre-model-operator/proofs and a second run with the same inputs skips.
test-platforms: install binaries-core images-platforms ## The release's operator image on every architecture: built, pushed, each started (qemu)
	SPYRE_RELEASE_PLATFORMS=$${SPYRE_RELEASE_PLATFORMS:-1} $(PY) -m pytest -m platforms \
		tests/integration/test_release_platforms.py $(PYTEST_ARGS)

images-prune: ## Drop outdated image archives and the images' buildah storage
	python3 tests/images/build.py prune

test: deps ## Everything: unit, golden, engine, integration (real control plane)
	# A demo left running (`make demo`/`demo-kwok`) would reconcile beside the tests' operators
	# and hold the real node's CPU: stop it first (a no-op when none runs).
	operator/scripts/demo.sh down --quiet
	# The session fixture starts the control plane (or reuses one from `make cluster-up`)
	# and stops it at the end if it started it.
	# Three pytest sessions side by side: the real-node tests, the kwok-only ones (on a control
	# plane of their own) and the local ones (tests/streams.py; with PYTEST_ARGS, one session).
	$(PY) tests/streams.py $(PYTEST_ARGS)

test-unit: install ## Only the tests that need neither the cluster nor vLLM
	$(PY) -m pytest -m 'not integration and not engine and not contract' $(PYTEST_ARGS)

demo: deps ## Real pods: chart-installed operator, tiny model compiled and served, a completion
	operator/scripts/demo.sh up $(DEMO_ARGS)

demo-down: ## Stop the demo: helm uninstall the operator, delete namespace spyre-demo
	@if [ -x $(PY) ]; then operator/scripts/demo.sh down; else echo "no venv, nothing to stop"; fi

demo-kwok: install binaries ## kwok only (no images, no real pods): operator + a sample SpyreModel to Ready
	operator/scripts/demo-kwok.sh

# Parts of `make bench`: operator (vs the API server's limit, kwok nodes), scaleup (a new replica
# vs a bare vLLM load), rollout (requests under rollouts), wakeup (a held request at zero vs a
# bare vLLM load, with KEDA and its HTTP add-on) and canary (a promotion with and without
# spec.serving.canary), the last four on the real node.
BENCH_PARTS ?= operator,configmaps,scaleup,rollout,wakeup,canary

bench: install binaries ## Benchmarks: operator vs API server, scale-up and wake-up from zero vs bare load, rollouts under traffic
	$(CLUSTER) up
	@if [[ ",$(BENCH_PARTS)," == *",operator,"* ]]; then \
		echo "$(PY) tests/bench/bench_operator.py $(BENCH_ARGS)"; \
		$(PY) tests/bench/bench_operator.py $(BENCH_ARGS); fi
	@if [[ ",$(BENCH_PARTS)," == *",configmaps,"* ]]; then \
		echo "$(PY) tests/bench/bench_configmaps.py"; \
		$(PY) tests/bench/bench_configmaps.py; fi
	$(PY) tests/bench/bench_realpods.py --parts $(BENCH_PARTS) $(BENCH_REAL_ARGS)

bench-engine: install ## Engine benchmark: warm vs cold start, wrapper overhead, drain
	$(PY) engine/bench/bench_engine.py $(BENCH_ARGS)

# A release: REGISTRY=host[:port]/path (required), VERSION (default and only allowed value:
# pyproject.toml's), ENGINE_BASE (engine/Containerfile's base; default IBM's spyre-runtime
# image), CPU_ENGINE=1 (the CPU engine image instead: no cards, as the tests and the demo),
# PLATFORMS (the operator image's; default amd64,arm64,ppc64le,s390x), CATALOG_BASE (the OLM
# catalog image's base; default opm's image), PLAIN_HTTP=1 for a registry without TLS. Log in
# first if it needs it (buildah login / helm registry login).
# See README "Get a release".
REGISTRY ?=
VERSION ?=
ENGINE_BASE ?=
CPU_ENGINE ?=
PLATFORMS ?=
CATALOG_BASE ?=
PLAIN_HTTP ?=
RELEASE_FLAGS = $(if $(VERSION),--version $(VERSION)) $(if $(PLAIN_HTTP),--plain-http)

release: install binaries images-platforms ## Build, push and pin the images and push the chart: REGISTRY=host/path [VERSION=] [SIGN_KEY=] [SOURCE=] [PLAIN_HTTP=1]
	@test -n "$(REGISTRY)" || { echo "usage: make release REGISTRY=host[:port]/path [VERSION=x.y.z] [ENGINE_BASE=image | ENGINE_LAYERS=\"amd64=base s390x=base ppc64le=base\" [ENGINE_PYTHON=/opt/vllm/bin/python]] [SIGN_KEY=cosign.key] [SOURCE=https://host/repo] [PLAIN_HTTP=1]"; exit 2; }
	$(PY) operator/scripts/release.py release --registry $(REGISTRY) $(RELEASE_FLAGS) \
		$(if $(ENGINE_BASE),--engine-base $(ENGINE_BASE)) $(if $(CPU_ENGINE),--cpu-engine) \
		$(if $(PLATFORMS),--platforms $(PLATFORMS)) $(if $(CATALOG_BASE),--catalog-base $(CATALOG_BASE)) \
		$(foreach l,$(ENGINE_LAYERS),--engine-layer $(l)) $(if $(ENGINE_PYTHON),--engine-python $(ENGINE_PYTHON)) \
		$(if $(SIGN_KEY),--sign-key $(SIGN_KEY)) $(if $(SOURCE),--source $(SOURCE))

bundle: install binaries-core ## The OLM bundle (ClusterServiceVersion from the chart) in dist/bundle: [OPERATOR_IMAGE=ref@digest] [ENGINE_IMAGE=ref@digest]
	rm -rf dist/bundle
	$(PY) operator/scripts/bundle.py --out dist/bundle \
		$(if $(OPERATOR_IMAGE),--operator-image $(OPERATOR_IMAGE)) $(if $(ENGINE_IMAGE),--engine-image $(ENGINE_IMAGE))

mirror: install binaries ## Copy a release into a site's registry: FROM=host/path TO=host/path [VERSION=] [PLAIN_HTTP=1]
	@test -n "$(FROM)" -a -n "$(TO)" || { echo "usage: make mirror FROM=host/path TO=host/path [VERSION=x.y.z] [PLAIN_HTTP=1]"; exit 2; }
	$(PY) operator/scripts/release.py mirror --from $(FROM) --to $(TO) $(RELEASE_FLAGS)

clean: cluster-down
	rm -rf .cluster
