# triton-operator: the two commands a newcomer needs are `make dev` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help venv test unit e2e crds golden dev dev-down tools lint bench-autoscaling bench-scale bench-spill

help:
	@echo "make dev       local cluster with simulated GPU nodes + operator + an example service"
	@echo "make dev-down  stop it"
	@echo "make test      unit and end-to-end tests (what CI runs)"
	@echo "make unit      unit tests only (no cluster, no network)"
	@echo "make e2e       end-to-end tests on a local cluster (E2E_USE_EXISTING_CLUSTER=1 uses $$KUBECONFIG)"
	@echo "make crds      regenerate crds/ from the API models"
	@echo "make golden    rewrite tests/golden after an intended rendering change"
	@echo "make bench-autoscaling  every autoscaling policy on four workloads -> bench/results/autoscaling.md"
	@echo "make bench-scale        the control plane at N=1000 services: bulk, idle, autoscaler -> bench/results/scale.md"
	@echo "make bench-spill        SLO during a GPU shortage with and without spill-over -> bench/results/spill.md"

$(STAMP): pyproject.toml runtime/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]' -e runtime
	touch $@

venv: $(STAMP)

unit: $(STAMP)
	$(PY) -m pytest tests

test: $(STAMP)
	$(PY) -m pytest tests e2e

e2e: $(STAMP)
	$(PY) -m pytest e2e

crds: $(STAMP)
	$(VENV)/bin/triton-operator crds --output-dir crds
	cp crds/*.yaml charts/triton-operator/files/crds/

golden: $(STAMP)
	UPDATE_GOLDEN=1 $(PY) -m pytest -q tests/test_render.py

bench-autoscaling: $(STAMP)
	$(PY) bench/autoscaling.py

# N=1000 by default; N=200 make bench-scale for a quick look.
bench-scale: $(STAMP)
	$(PY) bench/scale.py --services $${N:-1000}

bench-spill: $(STAMP)
	$(PY) bench/spill.py

lint: $(STAMP)
	$(VENV)/bin/lint-imports

tools:
	hack/install-tools.sh

dev: $(STAMP)
	hack/dev.sh up

dev-down:
	hack/dev.sh down
