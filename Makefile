# Single entry point. `make setup` is idempotent; `make test` and `make bench` run it first.
PY      := .venv/bin/python
STOCK   := scripts/python-stock
ARGS    ?=
PYTEST  := $(PY) -m pytest
# Base for edit/export/upstream-diff: 0.2.6 (the PyPI release) or main (upstream main, ../shared/upstream).
BASE    ?= 0.2.6

.PHONY: setup lint test test-main test-slow test-torch gpu-check bench upstream-diff edit export check-series stock-fails upstream-tests wheel clean

setup:
	bash scripts/setup.sh

# The README's test command; .ci/run calls exactly this. Lint, then the suite (the series' upstream-layout
# tests in the composed tree, then tests/) on the 0.2.6 build and on the series composed on upstream main,
# the two side by side (scripts/test.sh).
test: setup
	bash scripts/test.sh

# The suite on upstream main only.
test-main: setup
	bash scripts/run-tests.sh main -q -m "not slow"

# Upstream's pre-commit (ruff format --check, ruff check) on the files the series adds or changes.
lint: setup
	bash scripts/lint.sh

# The suite (0.2.6 base) against another torch release in its own venv: make test-torch VERSION=2.13.0
test-torch: setup
	bash scripts/test-torch.sh $(VERSION)

# Long property-based profile and heavy sweeps (run by hand, not in CI).
test-slow: setup
	$(PYTEST) tests -q -m slow

# On CUDA under nvFuser: the in-place write tests, rematerialization, CSE, upstream #2793's clone, nv_enable_scatter
# and a decode step under the CUDA-graph transform; one summary line. Without CUDA it says so and skips (exit 0).
gpu-check: setup
	$(PY) scripts/gpu_check.py $(ARGS)

# The main job: the KV-cache write benchmark (eager, Inductor, stock Thunder, patched Thunder).
# scripts/bench.py runs thunder.benchmarks.inplace_writes here and under $(STOCK) in a child process.
bench: setup
	$(PY) scripts/bench.py $(ARGS)

upstream-diff: setup
	$(PY) scripts/patchset.py upstream-diff --base $(BASE)

# Series editing round trip (BASE=main: the patches/main/ variants): see CONTRIBUTING.md.
edit:
	$(PY) scripts/patchset.py edit --base $(BASE)
export:
	$(PY) scripts/patchset.py export --base $(BASE)
	bash scripts/setup.sh

# Bisectability: every prefix of the series on 0.2.6 (compose, import, upstream fast suites), then the
# whole series on main (compose, import, upstream fast suites, tests/). One summary line at the end.
check-series: setup
	$(PY) scripts/check_series.py

# The fix's tests run against the pristine base: they must fail there (at their assertions).
stock-fails: setup
	bash scripts/stock-fails.sh

# Upstream's own tests shipped in the base wheel, on the patched build (slow; see README).
upstream-tests: setup
	bash scripts/upstream-tests.sh

wheel:
	$(PY) -m pip wheel --no-deps --no-build-isolation -w dist .

clean:
	rm -rf build dist *.egg-info
