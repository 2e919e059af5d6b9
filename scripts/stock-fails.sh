#!/usr/bin/env bash
# Run every test marked `claims_fix` on the PRISTINE base and check that each one fails at an
# assertion (AssertionError or pytest.fail), none passes, none errors in setup, none is skipped.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p build
scripts/python-stock -m pytest tests -q -m "claims_fix and not keeps_stock_behaviour and not slow" --junitxml=build/stock-fails.xml "$@" >build/stock-fails.log 2>&1
.venv/bin/python scripts/check_stock_fails.py build/stock-fails.xml; status=$?
# The tests the series adds in upstream's layout, each on the series without the patch that adds it.
.venv/bin/python scripts/series_fails.py | tee build/series-fails.log | tail -1
exit $status
