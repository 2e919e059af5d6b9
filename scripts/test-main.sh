#!/usr/bin/env bash
# The repository's tests/ on the series composed on upstream main (build/patched-main), after the
# upstream-diff check on main. PYTHONPATH puts build/patched-main in front of the .venv's .pth (which
# names build/patched, the 0.2.6 build); STOCK_BASE=main makes scripts/python-stock pristine main.
#   scripts/test-main.sh [PYTEST_ARGS...]      e.g. scripts/test-main.sh -q -m "not slow"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
.venv/bin/python scripts/patchset.py upstream-diff --base main
export PYTHONPATH="$root/build/patched-main" STOCK_BASE=main
.venv/bin/python -W ignore -c '
import thunder
assert "/build/patched-main/" in thunder.__file__, f"imports the wrong Thunder: {thunder.__file__}"
print(f"test-main: thunder {thunder.__version__} from {thunder.__file__}")'
exec .venv/bin/python -m pytest tests "$@"
