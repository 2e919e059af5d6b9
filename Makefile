# Single entry point. `make setup` is idempotent; `make test` and `make bench` run it first.
PY      := .venv/bin/python
STOCK   := scripts/python-stock
ARGS    ?=
PYTEST  := $(PY) -m pytest

.PHONY: setup test test-slow bench upstream-diff edit export stock-fails upstream-tests wheel clean

setup:
	bash scripts/setup.sh

# The README's test command; .ci/run calls exactly this.
test: setup
	$(PY) scripts/patchset.py upstream-diff
	$(PYTEST) tests -q -m "not slow"

# Long property-based profile and heavy sweeps (run by hand, not in CI).
test-slow: setup
	$(PYTEST) tests -q -m slow

# The main job: the KV-cache write benchmark (eager, Inductor, stock Thunder, patched Thunder).
# scripts/bench.py runs thunder.benchmarks.inplace_writes here and under $(STOCK) in a child process.
bench: setup
	$(PY) scripts/bench.py $(ARGS)

upstream-diff: setup
	$(PY) scripts/patchset.py upstream-diff

# Series editing round trip: see CONTRIBUTING.md.
edit:
	$(PY) scripts/patchset.py edit
export:
	$(PY) scripts/patchset.py export
	bash scripts/setup.sh

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
