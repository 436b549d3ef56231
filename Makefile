# mmfleet: `make test` (lint, type check, every test tier) and `make demo` (local control plane + operator).
# `make fast` is the part of `make test` that needs no cluster and builds nothing: lint, typecheck, unit, lab-unit.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Debian packages (each name is also the command checked for): prometheus is the local cluster's Prometheus server
# (the demo's too); lua5.1 runs the Argo CD health check as Argo CD would; redis-server is Argo CD's cache.
DEMO_PACKAGES   := prometheus
SYSTEM_PACKAGES := $(DEMO_PACKAGES) lua5.1 redis-server

.PHONY: install system-deps demo-deps binaries test-binaries lint typecheck fast unit lab-unit integration test demo \
	reliability crds clean

# Both distributions in one pip command, so that the `lab` extra's mmfleet-lab is the one in lab/ (no index has it).
$(STAMP): pyproject.toml lab/pyproject.toml VERSION
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[lab,dev]" -e ./lab
	@touch $@

install: $(STAMP)

define apt_install
	@missing=""; for p in $(1); do command -v $$p >/dev/null || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing Debian packages:$$missing (run: sudo apt-get install$$missing)"; exit 1; fi; \
	fi
endef

system-deps:
	$(call apt_install,$(SYSTEM_PACKAGES))
	@# iproute2's command is ip: the routing tests run the picker and the simulators in network namespaces.
	@command -v ip >/dev/null || { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null; \
	  else echo "missing Debian package: iproute2 (run: sudo apt-get install iproute2)"; exit 1; fi; }

demo-deps:
	$(call apt_install,$(DEMO_PACKAGES))

## Built from their Go modules once into ~/.cache/mmfleet: the Kubernetes, etcd and kwok binaries and the OpenTelemetry
## Collector (the demo's); helm, Argo CD, the endpoint picker, the inference simulator and the gateway stand-in too for
## the tests.
binaries: install
	$(BIN)/python -c "from mmfleet_lab.cluster import ensure_binaries; ensure_binaries(print)"
	$(BIN)/python -c "from mmfleet_lab.cluster import ensure_collector; ensure_collector(print)"

test-binaries: binaries
	$(BIN)/python -c "from mmfleet_lab.cluster import ensure_helm; ensure_helm(print)"
	$(BIN)/python -c "from mmfleet_lab.cluster import ensure_argocd; ensure_argocd(print)"
	$(BIN)/python -c "from mmfleet_lab.cluster import ensure_epp; ensure_epp(print)"
	$(BIN)/python -c "from mmfleet_lab.cluster import ensure_inference_sim; ensure_inference_sim(print)"
	$(BIN)/python -c "from mmfleet_lab.cluster import ensure_gateway_standin; ensure_gateway_standin(print)"

lint: install
	$(BIN)/ruff check operator tests
	$(BIN)/ruff format --check operator tests
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

## Fast tier: pure functions and contracts, no cluster. `unit` is the operator's (tests of mmfleet and the committed
## files); `lab-unit` the lab's (the twin, the benchmarks, the local cluster's parts, the lab's commands).
unit: install
	$(BIN)/pytest -q -n auto tests/unit/operator tests/contract

lab-unit: install
	$(BIN)/pytest -q tests/unit/lab

fast: lint typecheck unit lab-unit

## The local control plane's tiers: the binaries are built first (minutes, once), then integration and end-to-end, and
## again the tests of the fast tier that need a tool it may lack (helm, kubectl, promtool, Lua): here a missing tool fails.
TOOL_TESTS := tests/contract tests/unit/lab/test_localcluster_prometheus.py
integration: system-deps test-binaries
	MMFLEET_REQUIRE_TOOLS=1 $(BIN)/pytest -q $(TOOL_TESTS) tests/integration tests/e2e

## Every test: the fast checks first, so a failure there stops before any build; then the cluster's tiers.
test:
	$(MAKE) fast
	$(MAKE) integration

## The main job on the embedded default: a local control plane with Prometheus, the operator, the
## examples, and a traffic spike served by the digital twin while the operator scales.
demo: install demo-deps binaries
	$(BIN)/mmfleet demo

## docs/reliability.md, reproduced: every test file it cites, then the benchmarks that rewrite its tables (100 crash
## trials and 5 trials of each API server fault, then the fuzz run's three seeds through the running operator), each on
## a fresh local control plane; over an hour on 2 cores.
reliability: system-deps test-binaries
	$(BIN)/pytest -q $$(grep -o 'tests/[a-z_/]*\.py' docs/reliability.md | sort -u)
	$(BIN)/mmfleet bench faults --kills 100 --api-trials 5 --seed 0
	$(BIN)/mmfleet bench fuzz --seed 13 --seed 7 --seed 3 --count 1200 --live

## Regenerate what is generated from the code (CRD, chart values schema, Grafana dashboard, API docs, collector configurations); tests fail when these drift.
crds: install
	$(BIN)/mmfleet crd > crds/multimodalinferences.mmfleet.io.yaml
	cp crds/multimodalinferences.mmfleet.io.yaml charts/mmfleet/crds/
	$(BIN)/python -m mmfleet.chart_values > charts/mmfleet/values.schema.json
	$(BIN)/python -m mmfleet.dashboard > charts/mmfleet/files/dashboards/mmfleet.json
	$(BIN)/mmfleet docs api > docs/api.md
	$(BIN)/mmfleet collector-config --cloud generic > manifests/base/collector-config.yaml
	$(BIN)/mmfleet collector-config --cloud generic --kustomize-env > manifests/base/collector-env.yaml
	for c in eks aks ack; do $(BIN)/mmfleet collector-config --cloud $$c > manifests/overlays/$$c/collector-config.yaml; done
	for c in eks aks ack; do $(BIN)/mmfleet collector-config --cloud $$c --kustomize-env > manifests/overlays/$$c/collector-env.yaml; done
	for c in generic eks aks ack; do $(BIN)/mmfleet collector-config --cloud $$c > charts/mmfleet/files/collector-$$c.yaml; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
